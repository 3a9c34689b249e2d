//! `fathom perplexity`: perplexity over a text file as `llama-perplexity`
//! computes it, and the KL divergence of this engine's token distributions
//! against a base file (llama.cpp's format, read and written).
//!
//! The text is tokenized once (BOS in front when the model asks for it) and
//! cut into `n_chunk = tokens / n_ctx` chunks of `-c` tokens (at most
//! `--chunks`). Each chunk runs as a fresh sequence with its first token
//! replaced by BOS when the model adds BOS; the positions `n_ctx/2 ..
//! n_ctx-2` are scored, each on the token that follows it.

use std::fs::File;
use std::io::{BufReader, BufWriter, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use fathom_engine::logprob::log_prob;
use serde_json::json;

use crate::kld::{self, BaseHeader, BaseReader, BaseWriter, KlStats};
use crate::planning::PlanArgs;
use crate::session::{self, PreflightArgs};

#[derive(Args)]
#[command(
    after_help = "Output: the running perplexity after each chunk ([1]12.3456,[2]...) and \
`Final estimate: PPL = X +/- Y`, as llama-perplexity prints them; with --kl-divergence the per-chunk \
table and the PPL, KLD and Δp statistics llama-perplexity prints. Formats and how to compare with \
llama.cpp both ways: docs/quality.md"
)]
pub struct PerplexityArgs {
    /// A .gguf file, or a Hugging Face / MLX directory.
    pub model: String,
    /// The text to score (UTF-8). Not needed with --kl-divergence: the
    /// base file holds the tokens.
    #[arg(
        long,
        short = 'f',
        visible_alias = "file",
        required_unless_present = "kl_divergence"
    )]
    pub text: Option<PathBuf>,
    /// Tokens per chunk (the context of each evaluation) [default: 512;
    /// with --kl-divergence: the base file's]
    #[arg(long, short = 'c', visible_alias = "ctx-size")]
    pub max_tokens: Option<usize>,
    /// Tokens per batch, as llama.cpp's -b: a forward step is at most
    /// min(-b, --ubatch-size, -c) tokens.
    #[arg(
        long,
        short = 'b',
        visible_alias = "batch-size",
        default_value_t = 2048
    )]
    pub batch: usize,
    /// Score at most N chunks [default: all the text holds]
    #[arg(long, value_name = "N")]
    pub chunks: Option<usize>,
    /// The base-logits file (llama.cpp's format): written while computing
    /// perplexity, or read with --kl-divergence.
    #[arg(long, value_name = "FILE")]
    pub kl_divergence_base: Option<PathBuf>,
    /// Compare this model's token distributions with --kl-divergence-base
    /// (its tokens, context and chunks).
    #[arg(long, requires = "kl_divergence_base")]
    pub kl_divergence: bool,
    /// Print one JSON object on stdout (the running values go to stderr).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub plan: PlanArgs,
    #[command(flatten)]
    pub preflight: PreflightArgs,
}

/// llama.cpp's default `-c` for perplexity.
const DEFAULT_CTX: usize = 512;

/// What happens to each scored position's logits.
enum Mode {
    Perplexity,
    WriteBase(BaseWriter<BufWriter<File>>),
    Compare {
        reader: BaseReader<BufReader<File>>,
        stats: Box<KlStats>,
        rows: Vec<u16>,
    },
}

fn open_base(path: &Path) -> Result<BaseReader<BufReader<File>>> {
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let len = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len();
    Ok(BaseReader::new(
        BufReader::new(file),
        len,
        &path.display().to_string(),
    )?)
}

/// A status line on stderr, shown only when stderr is a terminal that
/// the running values on stdout do not share.
struct Progress {
    on: bool,
    started: Instant,
    total: usize,
}

impl Progress {
    /// `latest` is the running value after the last finished chunk.
    fn show(&self, done: usize, chunk: usize, chunks: usize, latest: &str) {
        if !self.on || done == 0 {
            return;
        }
        let secs = self.started.elapsed().as_secs_f64();
        let left = secs / done as f64 * (self.total - done) as f64;
        eprint!(
            "\r\x1b[Kperplexity: chunk {chunk}/{chunks}, {done}/{} positions, {left:.0} s left{latest}",
            self.total
        );
    }

    fn clear(&self) {
        if self.on {
            eprint!("\r\x1b[K");
        }
    }
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        anyhow::anyhow!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

pub fn run(args: &PerplexityArgs) -> Result<ExitCode> {
    let model = crate::pull::resolve(&args.model)?;
    let opened = session::open(&model)?;
    let vocab = opened.spec.vocab as usize;
    let trained = opened.spec.context_length;
    let add_bos = opened.tokenizer.add_bos();
    let bos = if add_bos {
        opened.tokenizer.bos()
    } else {
        None
    };
    let model_name = model.display().to_string();

    // The tokens and chunk length: from the text, or from the base file.
    let mut reader = None;
    let (tokens, n_ctx, source) = if args.kl_divergence {
        let path = args
            .kl_divergence_base
            .as_deref()
            .expect("clap requires it");
        let r = open_base(path)?;
        if r.header.n_vocab != vocab {
            bail!(
                "{}: written for a vocabulary of {} tokens, but {model_name} has {vocab}: a base from another model's vocabulary cannot be compared",
                path.display(),
                r.header.n_vocab
            );
        }
        let n_ctx = r.header.n_ctx;
        if let Some(c) = args.max_tokens.filter(|&c| c != n_ctx) {
            bail!(
                "-c {c} differs from the n_ctx {n_ctx} {} was written with; leave -c out to use the file's",
                path.display()
            );
        }
        let tokens = r.header.tokens.clone();
        reader = Some(r);
        (tokens, n_ctx, path.display().to_string())
    } else {
        let path = args.text.as_deref().expect("clap requires it");
        let text = read_text(path)?;
        let n_ctx = args.max_tokens.unwrap_or(DEFAULT_CTX);
        (
            opened.tokenizer.encode(&text, add_bos, false),
            n_ctx,
            path.display().to_string(),
        )
    };
    if n_ctx < 4 {
        bail!("-c {n_ctx}: a chunk needs at least 4 tokens (half of it is scored)");
    }
    if trained > 0 && n_ctx as u64 > trained {
        bail!("-c {n_ctx} is above the context {model_name} was trained for ({trained} tokens); use -c {trained} or less");
    }
    let n_chunk_max = tokens.len() / n_ctx;
    if !args.kl_divergence && tokens.len() < 2 * n_ctx {
        bail!(
            "{source} tokenizes to {} tokens, but perplexity with -c {n_ctx} needs at least {} (two chunks): use a longer text or a smaller -c",
            tokens.len(),
            2 * n_ctx
        );
    }
    if args.chunks == Some(0) {
        bail!("--chunks 0: score at least one chunk");
    }
    let n_chunk = args.chunks.map_or(n_chunk_max, |c| c.min(n_chunk_max));
    if args.batch == 0 {
        bail!("-b 0: a batch needs at least one token");
    }

    let mut inputs = args.plan.inputs(n_ctx as u64, 1)?;
    inputs.max_tokens_per_step = inputs
        .max_tokens_per_step
        .min(args.batch as u64)
        .min(n_ctx as u64);
    let step = inputs.max_tokens_per_step;
    let plan = args.plan.plan(&opened.spec, inputs)?;
    if let Some(code) = session::preflight(&model, &opened, &plan, &args.preflight) {
        return Ok(code);
    }

    let mut mode = match (&args.kl_divergence_base, reader) {
        (_, Some(reader)) => Mode::Compare {
            reader,
            stats: Box::default(),
            rows: Vec::new(),
        },
        (Some(path), None) => {
            let header = BaseHeader {
                n_ctx,
                n_vocab: vocab,
                n_chunk,
                tokens: tokens[..n_chunk * n_ctx].to_vec(),
            };
            let file =
                File::create(path).with_context(|| format!("creating {}", path.display()))?;
            Mode::WriteBase(
                BaseWriter::new(BufWriter::new(file), &header)
                    .with_context(|| format!("writing {}", path.display()))?,
            )
        }
        (None, None) => Mode::Perplexity,
    };

    let threads = plan.inputs.threads;
    let device = plan.inputs.device;
    let (mut engine, _load) = session::load(opened, plan)?;
    eprintln!(
        "perplexity: {} tokens, {n_chunk} chunks of {n_ctx} (BOS {}), {step} tokens per step, {threads} threads, device {}",
        tokens.len(),
        if bos.is_some() { "first" } else { "not added" },
        device.name()
    );

    let first = n_ctx / 2;
    let scored = kld::scored_per_chunk(n_ctx);
    let nv = kld::row_len(vocab);
    let progress = Progress {
        on: std::io::stderr().is_terminal() && (args.json || !std::io::stdout().is_terminal()),
        started: Instant::now(),
        total: n_chunk * scored,
    };
    let started = Instant::now();
    let (mut nll_sum, mut nll2_sum, mut count) = (0.0f64, 0.0f64, 0usize);
    let mut running = Vec::with_capacity(n_chunk);
    let mut kl_running = Vec::new();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // Running values go to stdout, or under --json to stderr (where the
    // status line shows the latest instead when there is one).
    let mut latest = String::new();
    let mut say = |text: &str| {
        if args.json {
            if !progress.on {
                eprint!("{text}");
            }
        } else {
            let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
        }
    };
    if matches!(mode, Mode::Compare { .. }) {
        say(&format!("{}\n", kld::TABLE_HEADER));
    }
    let mut chunk_tokens = Vec::with_capacity(n_ctx);
    for i in 0..n_chunk {
        let original = &tokens[i * n_ctx..(i + 1) * n_ctx];
        chunk_tokens.clear();
        chunk_tokens.extend_from_slice(original);
        if let Some(b) = bos {
            chunk_tokens[0] = b;
        }
        if let Mode::Compare { reader, rows, .. } = &mut mode {
            if !reader.next_chunk(rows)? {
                bail!("{source}: ended before chunk {}", i + 1);
            }
        }
        let mut failed = None;
        let done_before = i * scored;
        engine.score(&chunk_tokens, first, &mut |pos, logits| {
            if pos + 1 >= n_ctx || failed.is_some() {
                return;
            }
            let target = original[pos + 1] as usize;
            match &mut mode {
                Mode::Perplexity => {
                    // The negative log-likelihood llama.cpp's perplexity
                    // adds (without a base file): the engine's one
                    // log-softmax, which the server's logprobs report too.
                    let v = -log_prob(logits, target);
                    nll_sum += v;
                    nll2_sum += v * v;
                }
                Mode::WriteBase(w) => match w.push(logits, target) {
                    Ok(v) => {
                        nll_sum += v;
                        nll2_sum += v * v;
                    }
                    Err(e) => failed = Some(e),
                },
                Mode::Compare { stats, rows, .. } => {
                    let at = (pos - first) * nv;
                    stats.add(logits, &rows[at..at + nv], target);
                }
            }
            let done = done_before + pos + 1 - first;
            if done.is_multiple_of(32) {
                progress.show(done, i + 1, n_chunk, &latest);
            }
        })?;
        if let Some(e) = failed {
            let path = args.kl_divergence_base.as_deref().unwrap_or(Path::new(""));
            return Err(e).with_context(|| format!("writing {}", path.display()));
        }
        count += scored;
        progress.clear();
        if i == 0 {
            let pass = started.elapsed().as_secs_f64();
            eprintln!(
                "perplexity: {pass:.2} seconds per pass - ETA {:.2} minutes",
                pass * n_chunk as f64 / 60.0
            );
        }
        match &mode {
            Mode::Compare { stats, .. } => {
                let r = stats.running();
                say(&format!("{}\n", r.line(i + 1)));
                latest = format!(
                    ", KLD {:.5}, same top {:.3}%",
                    r.kld.value,
                    100.0 * r.same_top.value
                );
                kl_running.push(r);
            }
            _ => {
                let ppl = (nll_sum / count as f64).exp();
                say(&format!("[{}]{ppl:.4},", i + 1));
                latest = format!(", PPL {ppl:.4}");
                running.push(ppl);
            }
        }
        progress.show(done_before + scored, i + 1, n_chunk, &latest);
    }
    progress.clear();
    say("\n");
    let seconds = started.elapsed().as_secs_f64();

    let base = args
        .kl_divergence_base
        .as_ref()
        .map(|p| p.display().to_string());
    let mut doc = json!({
        "model": model_name,
        "source": source,
        "device": device.name(),
        "threads": threads,
        "n_ctx": n_ctx,
        "n_batch": args.batch,
        "tokens_per_step": step,
        "add_bos": bos.is_some(),
        "tokens": tokens.len(),
        "n_chunk": n_chunk,
        "scored_tokens": count,
        "seconds": seconds,
        "kl_divergence_base": base,
    });
    match mode {
        Mode::Compare { stats, .. } => {
            let summary = (stats.count() >= 100).then(|| stats.summary());
            if args.json {
                doc["chunks"] = serde_json::to_value(&kl_running)?;
                doc["kl_divergence"] = summary.as_ref().map_or(json!(null), summary_json);
                println!("{doc}");
            } else if let Some(s) = &summary {
                println!("\n{}", s.text());
            } else {
                println!("(fewer than 100 positions: no summary statistics)");
            }
        }
        mode => {
            if let Mode::WriteBase(w) = mode {
                let path = args.kl_divergence_base.as_deref().unwrap_or(Path::new(""));
                w.finish()
                    .with_context(|| format!("writing {}", path.display()))?;
                eprintln!("perplexity: wrote the base logits to {}", path.display());
            }
            let mean = nll_sum / count as f64;
            let ppl = mean.exp();
            let var = nll2_sum / count as f64 - mean * mean;
            let unc = (var > 0.0).then(|| (var / (count - 1) as f64).sqrt() * ppl);
            if args.json {
                doc["chunks"] = json!(running);
                doc["ppl"] = json!(ppl);
                doc["ppl_uncertainty"] = json!(unc);
                doc["mean_nll"] = json!(mean);
                println!("{doc}");
            } else {
                match unc {
                    Some(unc) => println!("Final estimate: PPL = {ppl:.4} +/- {unc:.5}"),
                    None => println!(
                        "Final estimate: PPL = {ppl:.4} (no uncertainty: the variance of log(prob) is not positive)"
                    ),
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn summary_json(s: &kld::Summary) -> serde_json::Value {
    let pct = |v: &[(&str, f64)]| {
        serde_json::Value::Object(v.iter().map(|(k, x)| (k.to_string(), json!(x))).collect())
    };
    json!({
        "count": s.count,
        "ppl": s.ppl,
        "ppl_base": s.ppl_base,
        "ln_ppl_correlation": s.ln_ppl_correlation,
        "ln_ppl_ratio": s.ln_ppl_ratio,
        "ppl_ratio": s.ppl_ratio,
        "ppl_diff": s.ppl_diff,
        "kld": s.kld,
        "kld_percentiles": pct(&s.kld_percentiles),
        "p_diff": s.p_diff,
        "p_diff_percentiles": pct(&s.p_diff_percentiles),
        "max_abs_p_diff": s.max_abs_p_diff,
        "rms_p_diff": s.rms_p_diff,
        "same_top": s.same_top,
    })
}
