//! Text output: aligned lines with binary units and exact bytes.

use std::fmt::Write;
use std::path::Path;

use fathom_plan::placement::Placement;
use fathom_plan::quant::QuantAdvice;
use fathom_plan::size::{format_binary, format_bytes};
use fathom_plan::tensor_parallel::{Split, TensorParallel};
use fathom_plan::{HostPlan, MemoryPlan};
use fathom_spec::ModelSpec;

/// One aligned row: label, size, exact bytes, and how it was derived.
pub fn row(out: &mut String, label: &str, bytes: u64, note: &str) {
    let _ = writeln!(
        out,
        "  {label:<18} {:>11}  {:>18}  {note}",
        format_binary(bytes),
        format!("({bytes} bytes)")
    );
}

fn term_label(name: &str) -> &'static str {
    match name {
        "weights" => "Weights",
        "converted" => "Converted at load",
        "kv" => "KV cache",
        "recurrent_state" => "Recurrent state",
        "activations" => "Activations",
        "runtime" => "Runtime overhead",
        "backend" => "Backend",
        "backend_inflight" => "Backend in-flight",
        "headroom" => "Headroom",
        "requests" => "Request buffers",
        "constraints" => "Constraints",
        "cuda_libraries" => "CUDA libraries",
        "cuda_kernels_and_graphs" => "Kernels + graphs",
        "host_buffers" => "Host buffers",
        "weights_staging" => "Weights staging",
        "nccl" => "NCCL buffers",
        "nccl_library" => "NCCL library",
        "device_contexts" => "Device contexts",
        "host_kv" => "Host layers' KV",
        "host_recurrent_state" => "Host layers' state",
        "host_activations" => "Host activations",
        _ => "Other",
    }
}

pub fn plan_text(model: &Path, format: &str, spec: &ModelSpec, plan: &MemoryPlan) -> String {
    let mut out = String::new();
    let i = &plan.inputs;
    let _ = writeln!(
        out,
        "fathom {} memory plan for {}",
        env!("CARGO_PKG_VERSION"),
        model.display()
    );
    let _ = writeln!(
        out,
        "  model: {} ({}, {format}), {} parameters, trained context {}",
        spec.family.name(),
        spec.architecture,
        format_count(spec.params()),
        spec.context_length
    );
    let _ = writeln!(
        out,
        "  inputs: {} tokens x {} seq, KV {}, {} tokens per step, {} threads, device {}",
        i.context,
        i.batch,
        i.kv_dtype.name(),
        i.max_tokens_per_step,
        i.threads,
        i.device.name()
    );
    for note in &spec.notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out.push('\n');
    match &plan.tensor_parallel {
        Some(tp) => {
            let _ = writeln!(
                out,
                "Device memory ({}, each of {} devices holds the same share; --memory is per device):",
                i.device.name(),
                tp.size
            );
        }
        None if plan.host.is_some() => {
            let _ = writeln!(out, "Device memory ({}):", i.device.name());
        }
        None => {}
    }
    for term in &plan.terms {
        let label = term_label(term.name);
        if term.name == "headroom" && plan.headroom_bytes < 0 {
            let _ = writeln!(
                out,
                "  {label:<18} {:>11}  {:>18}  {}",
                format!("-{}", format_binary(term.bytes)),
                format!("(-{} bytes)", term.bytes),
                term.derivation
            );
        } else {
            row(&mut out, label, term.bytes, &term.derivation);
        }
    }
    row(
        &mut out,
        "Total",
        plan.total_bytes,
        "saturating sum of the terms above",
    );
    row(
        &mut out,
        "Available",
        plan.available_bytes,
        &plan.available_source,
    );
    out.push('\n');
    if plan.fits {
        let _ = writeln!(out, "FITS: {} of headroom", format_bytes(plan.slack_bytes));
    } else {
        let _ = writeln!(
            out,
            "DOES NOT FIT: {} over budget",
            format_bytes(plan.overflow_bytes)
        );
    }
    if let Some(host) = &plan.host {
        out.push_str(&host_text(host));
    }
    let max_ctx = plan.max_context_that_fits;
    let why = if max_ctx == 0 {
        " (not even one token: lower the batch, use a smaller model or quantization, or q8_0 KV)"
            .to_string()
    } else if max_ctx == spec.context_length {
        " (the model's trained maximum)".to_string()
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "Largest context that fits at batch {}: {max_ctx} tokens{why}",
        i.batch
    );
    if let Some(tp) = &plan.tensor_parallel {
        tensor_parallel_text(&mut out, tp);
    }
    if let Some(placed) = &plan.placement {
        placement_text(&mut out, placed, spec);
    }
    out
}

/// Where the placement puts each layer, runs of alike layers on one line
/// (a hybrid model's linear layers take their recurrent state along).
fn placement_text(out: &mut String, p: &Placement, spec: &ModelSpec) {
    let held = if spec.linear.is_some() {
        "attention, KV and recurrent state"
    } else {
        "attention and KV"
    };
    let _ = writeln!(
        out,
        "
Placement ({}): {} of {} layers on the GPU, {} on the host; embeddings {}, output head {}; weights {} on the GPU, {} on the host",
        p.chosen_by,
        p.gpu_layers,
        p.n_layers,
        p.n_layers - p.gpu_layers,
        p.embeddings.name(),
        p.output.name(),
        format_binary(p.device_weights_bytes),
        format_binary(p.host_weights_bytes)
    );
    let mut at = 0;
    while at < p.layers.len() {
        let first = &p.layers[at];
        let run = p.layers[at..]
            .iter()
            .take_while(|l| l.place == first.place && l.experts == first.experts)
            .count();
        let last = &p.layers[at + run - 1];
        let (device, host) = p.layers[at..at + run]
            .iter()
            .fold((0u64, 0u64), |(d, h), l| {
                (d + l.device_bytes, h + l.host_bytes)
            });
        let experts = match first.experts {
            Some(e) if e != first.place => format!(", routed experts {}", e.name()),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "  layers {:>3}-{:<3}  {} ({held}){experts}: {} on the GPU, {} on the host",
            first.layer,
            last.layer,
            first.place.name(),
            format_binary(device),
            format_binary(host)
        );
        at += run;
    }
    let _ = writeln!(
        out,
        "  {:>10}  {:>12}  {:>12}  {:<12}  largest context (device)",
        "GPU layers", "device total", "host total", "fits"
    );
    for o in &p.options {
        let fits = match (o.fits, o.host_fits) {
            (true, true) => "yes",
            (false, true) => "no (device)",
            (true, false) => "no (host)",
            (false, false) => "no (both)",
        };
        let _ = writeln!(
            out,
            "  {:>10}  {:>12}  {:>12}  {fits:<12}  {}{}",
            o.gpu_layers,
            format_binary(o.device_total_bytes),
            format_binary(o.host_total_bytes),
            o.max_context_that_fits,
            if o.gpu_layers == p.gpu_layers {
                "  <- this plan"
            } else {
                ""
            }
        );
    }
    for (pattern, place, tensors) in &p.overrides {
        let _ = writeln!(
            out,
            "  --override-tensor {pattern}={}: {tensors} tensors",
            place.name()
        );
    }
}

/// How the model is split, and the table of device counts.
fn tensor_parallel_text(out: &mut String, tp: &TensorParallel) {
    let kv = if tp.kv_replicas > 1 {
        format!(
            "{} KV head per device, each held by {} devices",
            tp.kv_heads_per_device, tp.kv_replicas
        )
    } else {
        format!("{} KV heads per device", tp.kv_heads_per_device)
    };
    let experts = if tp.expert_ffn_per_device > 0 {
        format!(", each expert's FFN {} columns", tp.expert_ffn_per_device)
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "\nTensor parallel over {} devices: {} heads, {kv}, FFN {} columns{experts} per device",
        tp.size, tp.heads_per_device, tp.ffn_per_device
    );
    for w in &tp.weights {
        let split = match w.split {
            Split::Column => "column-split",
            Split::Row => "row-split",
            Split::Replicated => "whole on every device",
        };
        let _ = writeln!(
            out,
            "  {:<18} {:>11} of {:>11}  {split}, {} tensor{}",
            w.name,
            format_binary(w.device_bytes),
            format_binary(w.bytes),
            w.tensors,
            if w.tensors == 1 { "" } else { "s" }
        );
    }
    let _ = writeln!(
        out,
        "\nWhich device count fits (same inputs; per device):\n  {:>7} {:>11} {:>11} {:>11}  {:<12} largest context",
        "devices", "weights", "KV", "total", "fits"
    );
    for s in &tp.sizes {
        match &s.error {
            Some(error) => {
                let _ = writeln!(out, "  {:>7} cannot split: {error}", s.size);
            }
            None => {
                let _ = writeln!(
                    out,
                    "  {:>7} {:>11} {:>11} {:>11}  {:<12} {}",
                    s.size,
                    format_binary(s.weights_bytes),
                    format_binary(s.kv_bytes),
                    format_binary(s.total_bytes),
                    if s.fits { "fits" } else { "does not fit" },
                    s.max_context_that_fits
                );
            }
        }
    }
}

/// A discrete GPU's host budget: its terms, total, available and verdict.
pub fn host_text(host: &HostPlan) -> String {
    let mut out = String::from("\nHost memory:\n");
    for term in &host.terms {
        row(
            &mut out,
            term_label(term.name),
            term.bytes,
            &term.derivation,
        );
    }
    row(&mut out, "Total", host.total_bytes, "sum of the host terms");
    if host.available_source != "unchecked" {
        row(
            &mut out,
            "Available",
            host.available_bytes,
            &host.available_source,
        );
    }
    let verdict = match (host.available_source.as_str(), host.fits) {
        ("unchecked", _) => "host memory not checked".to_string(),
        (_, true) => format!(
            "HOST FITS: {} of headroom",
            format_bytes(host.available_bytes - host.total_bytes)
        ),
        (_, false) => format!(
            "HOST DOES NOT FIT: {} over budget",
            format_bytes(host.total_bytes - host.available_bytes)
        ),
    };
    let _ = writeln!(out, "{verdict}");
    out
}

pub fn quant_text(advice: &QuantAdvice, max_tokens: u64) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nQuantization advice: {} parameters, KV at {max_tokens} tokens, against {} (weights + KV only)",
        format_count(advice.params),
        format_binary(advice.available_bytes)
    );
    for o in &advice.options {
        let _ = writeln!(
            out,
            "  {:<5} weights {:>11} + KV {:>11} = {:>11}  {}",
            o.quant,
            format_binary(o.weights_bytes),
            format_binary(o.kv_bytes),
            format_binary(o.total_bytes),
            if o.fits { "fits" } else { "does not fit" }
        );
    }
    match advice.recommended {
        Some(q) => {
            let _ = writeln!(out, "Recommended: {q} (the most precise that fits)");
        }
        None => {
            let _ = writeln!(
                out,
                "Recommended: none fits; lower --max-tokens or --batch, or use q8_0 KV"
            );
        }
    }
    out
}

/// `134.52 M`, `8.03 B`.
fn format_count(n: u64) -> String {
    match n {
        n if n >= 1_000_000_000 => format!("{:.2} B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.2} M", n as f64 / 1e6),
        n => n.to_string(),
    }
}
