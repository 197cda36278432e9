//! `kairos batch [OPTIONS] SCRIPT [ARGS...]`: submits a batch script the way sbatch does.
//!
//! Options come from the script's leading comment block (`#SBATCH` or `#KAIROS` lines, until the
//! first line that is neither blank nor a comment) and from the command line before SCRIPT,
//! which wins. Every option is one of sbatch's that kairos supports; any other is refused,
//! naming it, and nothing is submitted. The script itself travels with the job (its text is the
//! command, run by the interpreter of its `#!` line, `/bin/sh` without one), like sbatch's copy
//! of it; `-o`/`-e` send its output to files named by patterns (`%j %A %a %x %u %N %%`),
//! expanded on the node from the job's Slurm variables.

use std::collections::BTreeMap;

use clap::Args;

use crate::args::{parse_array, parse_gpus, parse_time};
use crate::jobs::SubmitArgs;

#[derive(Args, Debug)]
pub struct BatchArgs {
    /// sbatch options (override the script's #SBATCH lines), then the script and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required = true,
        value_name = "[OPTIONS] SCRIPT [ARGS]"
    )]
    pub args: Vec<String>,
}

/// The sbatch options kairos takes: (short, long, takes a value).
const OPTIONS: &[(Option<char>, &str, bool)] = &[
    (Some('J'), "job-name", true),
    (None, "gres", true),
    (Some('G'), "gpus", true),
    (Some('t'), "time", true),
    (Some('q'), "qos", true),
    (Some('p'), "partition", true),
    (Some('A'), "account", true),
    (None, "reservation", true),
    (Some('a'), "array", true),
    (Some('d'), "dependency", true),
    (None, "requeue", false),
    (None, "no-requeue", false),
    (Some('o'), "output", true),
    (Some('e'), "error", true),
    (Some('D'), "chdir", true),
    (None, "export", true),
    (Some('N'), "nodes", true),
    (Some('H'), "hold", false),
    (None, "signal", true),
    (Some('c'), "cpus-per-task", true),
    (None, "mem", true),
    (None, "mem-per-gpu", true),
    (None, "mem-per-cpu", true),
    (Some('n'), "ntasks", true),
    (None, "ntasks-per-node", true),
    (None, "gpus-per-node", true),
    (None, "gpus-per-task", true),
    (Some('C'), "constraint", true),
    // Topology: at most N leaf switches (the cluster's lowest level), relaxed after the wait.
    (None, "switches", true),
    // pyxis's container options.
    (None, "container-image", true),
    (None, "container-mounts", true),
    (None, "container-workdir", true),
    // The script is this command (`#!/bin/sh`), and no SCRIPT is given.
    (None, "wrap", true),
    // Accepted and ignored: kairos sends no mail (watch `kairos wait` or the job's events).
    (None, "mail-type", true),
    (None, "mail-user", true),
];

/// Options by long name (a later `set` of the same one wins), and every unsupported one met,
/// with where.
#[derive(Debug, Default)]
struct Options(BTreeMap<&'static str, String>, Vec<String>);

impl Options {
    /// Reads options from `tokens` until the first that is not one; returns how many it took.
    fn read(&mut self, tokens: &[String], source: &str) -> Result<usize, String> {
        let mut i = 0;
        while i < tokens.len() {
            let token = &tokens[i];
            let (spec, inline) = if let Some(long) = token.strip_prefix("--") {
                let (name, value) = match long.split_once('=') {
                    Some((n, v)) => (n, Some(v.to_string())),
                    None => (long, None),
                };
                let Some(spec) = OPTIONS.iter().find(|(_, l, _)| *l == name) else {
                    i += self.unsupported(tokens, i, source, &format!("--{name}"), value.is_some());
                    continue;
                };
                (spec, value)
            } else if let Some(short) = token.strip_prefix('-').filter(|s| !s.is_empty()) {
                let c = short.chars().next().unwrap_or('-');
                let rest = &short[c.len_utf8()..];
                let value = (!rest.is_empty()).then(|| rest.trim_start_matches('=').to_string());
                let Some(spec) = OPTIONS.iter().find(|(s, _, _)| *s == Some(c)) else {
                    i += self.unsupported(tokens, i, source, &format!("-{c}"), value.is_some());
                    continue;
                };
                (spec, value)
            } else {
                return Ok(i);
            };
            let &(_, long, takes_value) = spec;
            let value = match (takes_value, inline) {
                (false, None) => String::new(),
                (false, Some(_)) => return Err(format!("{source}: --{long} takes no value")),
                (true, Some(v)) => v,
                (true, None) => {
                    i += 1;
                    tokens.get(i).cloned().ok_or_else(|| format!("{source}: --{long} needs a value"))?
                }
            };
            if long == "requeue" || long == "no-requeue" {
                self.0.remove("requeue");
                self.0.remove("no-requeue");
            }
            self.0.insert(long, value);
            i += 1;
        }
        Ok(i)
    }

    /// Notes an unsupported option at `tokens[i]`; returns how many tokens it spans (in a
    /// directive, a following word that is no option is taken as its value).
    fn unsupported(
        &mut self,
        tokens: &[String],
        i: usize,
        source: &str,
        option: &str,
        inline: bool,
    ) -> usize {
        self.1.push(format!("{option} ({source})"));
        let value_follows =
            source != "command line" && !inline && tokens.get(i + 1).is_some_and(|t| !t.starts_with('-'));
        1 + usize::from(value_follows)
    }

    /// Refuses, naming every unsupported option at once.
    fn refuse_unsupported(&self) -> Result<(), String> {
        match self.1.as_slice() {
            [] => Ok(()),
            [one] => Err(format!("unsupported option {one}; nothing was submitted")),
            many => Err(format!("unsupported options {}; nothing was submitted", many.join(", "))),
        }
    }

    fn get(&self, long: &str) -> Option<&str> {
        self.0.get(long).map(String::as_str)
    }
}

/// Splits a directive's text into words like a shell: quotes group, `#` starts a comment.
fn words(line: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => out.extend(word.take()),
            '#' if word.is_none() => break,
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(ch) => w.push(ch),
                        None => return Err("unclosed ' quote".into()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.extend(chars.next()),
                        Some(ch) => w.push(ch),
                        None => return Err("unclosed \" quote".into()),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            ch => word.get_or_insert_with(String::new).push(ch),
        }
    }
    out.extend(word);
    Ok(out)
}

/// The `#SBATCH`/`#KAIROS` directives of a script's leading comment block.
fn directives(script: &str, path: &str) -> Result<Options, String> {
    let mut options = Options::default();
    for (n, line) in script.lines().enumerate() {
        let line = line.trim();
        if n == 0 && line.starts_with("#!") {
            continue;
        }
        if line.is_empty() {
            continue;
        }
        if !line.starts_with('#') {
            break;
        }
        let Some(rest) = line.strip_prefix("#SBATCH").or_else(|| line.strip_prefix("#KAIROS")) else {
            continue;
        };
        let source = format!("{path}:{}", n + 1);
        let tokens = words(rest).map_err(|e| format!("{source}: {e}"))?;
        let used = options.read(&tokens, &source)?;
        if used < tokens.len() {
            return Err(format!("{source}: \"{}\" is not an option", tokens[used]));
        }
    }
    Ok(options)
}

/// The interpreter of a script's `#!` line (`/bin/sh` without one).
fn interpreter(script: &str) -> Vec<String> {
    match script.lines().next().and_then(|l| l.strip_prefix("#!")) {
        Some(line) => line.split_whitespace().map(str::to_string).collect(),
        None => vec!["/bin/sh".to_string()],
    }
}

/// GPUs per node and their model: `--gres gpu[:TYPE]:N`, `--gpus [TYPE:]N`,
/// `--gpus-per-node [TYPE:]N` (none by default, as sbatch; a model set from `--constraint`).
fn gpus_of(o: &Options) -> Result<(u32, Option<String>), String> {
    let bad = |long: &str, e: String| format!("--{long}: {e}");
    let (mut gpus, mut gpu_model) = (0u32, o.get("constraint").map(str::to_string));
    if let Some(g) = o.get("gres") {
        // gpu[:type]:N
        let parts: Vec<&str> = g.split(':').collect();
        match parts.as_slice() {
            ["gpu"] => {}
            ["gpu", n] => gpus = parse_gpus(n).map_err(|e| bad("gres", e))?,
            ["gpu", model, n] => {
                gpus = parse_gpus(n).map_err(|e| bad("gres", e))?;
                gpu_model = Some(model.to_string());
            }
            _ => {
                return Err(format!(
                    "--gres: \"{g}\" is not gpu[:TYPE]:N (the only resource kairos schedules)"
                ))
            }
        }
    }
    for long in ["gpus", "gpus-per-node"] {
        if let Some(g) = o.get(long) {
            match g.split_once(':') {
                Some((model, n)) => {
                    gpus = parse_gpus(n).map_err(|e| bad(long, e))?;
                    gpu_model = Some(model.to_string());
                }
                None => gpus = parse_gpus(g).map_err(|e| bad(long, e))?,
            }
        }
    }
    Ok((gpus, gpu_model))
}

/// `--signal [B:]SIG` (not `@TIME`).
fn checkpoint_signal_of(o: &Options) -> Result<Option<String>, String> {
    Ok(match o.get("signal") {
        None => None,
        Some(s) if s.contains('@') => {
            return Err(format!(
                "--signal: \"{s}\": a signal at a time before the limit (@TIME) is not supported"
            ))
        }
        Some(s) => Some(s.strip_prefix("B:").unwrap_or(s).to_string()),
    })
}

/// The most bytes of a script: it travels as the job's command, within the job spec's bound.
const SCRIPT_BYTES_MAX: u64 = kairos_scheduler::validate::SPEC_BYTES_MAX as u64 - 16 * 1024;

/// The script at `path`, its size checked before it is read.
fn read_script(path: &str) -> Result<String, String> {
    let size = std::fs::metadata(path).map_err(|e| format!("reading {path}: {e}"))?.len();
    if size > SCRIPT_BYTES_MAX {
        return Err(format!(
            "{path} is {size} bytes; a batch script may have at most {SCRIPT_BYTES_MAX} (it travels with the job)"
        ));
    }
    std::fs::read_to_string(path).map_err(|e| format!("reading {path}: {e}"))
}

/// `kairos batch --help`: the usage and every sbatch option kairos takes.
pub fn help() -> String {
    let mut out = String::from(
        "Submit a batch script like sbatch: options from its #SBATCH (or #KAIROS) lines, those on the \
         command line overriding them; prints the job's (or array's) id.\n\n\
         Usage: kairos batch [OPTIONS] SCRIPT [ARGS...]\n       kairos batch [OPTIONS] --wrap CMD\n\n\
         The job runs in the submit directory (--chdir) and takes the submitter's environment \
         (--export, ALL by default; never kairos's own variables).\n\nOptions (sbatch's):\n",
    );
    for (short, long, value) in OPTIONS {
        let short = short.map(|c| format!("-{c}, ")).unwrap_or_default();
        let value = if *value { " VALUE" } else { "" };
        out.push_str(&format!("  {short:>4}--{long}{value}\n"));
    }
    out.push_str("\nAny other option is refused, naming it; nothing is submitted.\n");
    out
}

/// The submit a batch command line asks for (`args`: options, SCRIPT, its arguments), reading
/// the script from disk; `env` is the submitting environment (for `--export`).
pub fn submit_args(args: &[String], env: &BTreeMap<String, String>) -> Result<SubmitArgs, String> {
    let mut given = Options::default();
    let used = given.read(args, "command line")?;
    // The command line's own refusals come before the script is looked for.
    given.refuse_unsupported()?;
    let (path, script, script_args) = script_of(&given, args, used)?;
    let mut options = directives(&script, &path)?;
    options.1.extend(given.1);
    options.refuse_unsupported()?;
    // The command line wins over the script.
    options.0.extend(given.0);
    // The script travels as the command: INTERPRETER -c TEXT SCRIPT ARGS..., behind a shell that
    // sends its output to the -o/-e files when asked.
    let mut command = interpreter(&script);
    command.extend(["-c".to_string(), script.clone(), path.clone()]);
    command.extend(script_args.iter().cloned());
    submit_of(&options, &path, command, env)
}

/// The script: its path (`wrap` for `--wrap`), its text and its arguments (what follows it in
/// `args`, past the `used` options).
fn script_of<'a>(
    given: &Options,
    args: &'a [String],
    used: usize,
) -> Result<(String, String, &'a [String]), String> {
    match given.get("wrap") {
        Some(command) => {
            if let Some(extra) = args.get(used) {
                return Err(format!("--wrap is the script: \"{extra}\" cannot follow it"));
            }
            Ok(("wrap".to_string(), format!("#!/bin/sh\n{command}\n"), &args[used..]))
        }
        None => {
            let path = args
                .get(used)
                .ok_or("a batch script is needed: kairos batch [OPTIONS] SCRIPT [ARGS] (or --wrap CMD)")?;
            Ok((path.clone(), read_script(path)?, &args[used + 1..]))
        }
    }
}

/// Slurm's `--switches=N[@max-wait]`: at most N domains of the cluster's lowest topology level,
/// relaxed to preferred after the wait (Slurm's time format).
fn switches(text: &str) -> Result<kairos_proto::v1::TopologyRequest, String> {
    let (count, wait) = text.split_once('@').map_or((text, None), |(c, w)| (c, Some(w)));
    let max_domains: u32 = count.parse().map_err(|_| format!("\"{count}\" is not a count of switches"))?;
    if !(1..=64).contains(&max_domains) {
        return Err("the count of switches must be 1 to 64".into());
    }
    let relax_after_s = wait.map(parse_time).transpose()?.unwrap_or(0);
    Ok(kairos_proto::v1::TopologyRequest { level: String::new(), required: true, max_domains, relax_after_s })
}

/// The submit of `command` (the script at `path`) with the options `o` (its directives and
/// the command line's), each checked; `env` is the submitting environment.
fn submit_of(
    o: &Options,
    path: &str,
    command: Vec<String>,
    env: &BTreeMap<String, String>,
) -> Result<SubmitArgs, String> {
    let bad = |long: &str, e: String| format!("--{long}: {e}");
    let (gpus, gpu_model) = gpus_of(o)?;
    // Checked here too, so a bad one names the script's line's option before anything else.
    let dependency = o.get("dependency").map(str::to_string);
    dependency.as_deref().map(crate::args::parse_dependency).transpose()?;
    let checkpoint_signal = checkpoint_signal_of(o)?;
    let export = o.get("export").map(str::to_string);
    // What it exports is checked now (the environment is read again at the submit).
    crate::args::export_env(export.as_deref(), env).map_err(|e| bad("export", e))?;
    let name = o
        .get("job-name")
        .map(str::to_string)
        .unwrap_or_else(|| path.rsplit('/').next().unwrap_or(path).to_string());
    let number = |long: &str| o.get(long).map(|n| parse_gpus(n).map_err(|e| bad(long, e))).transpose();
    let size =
        |long: &str| o.get(long).map(|n| crate::jobs::parse_size(n).map_err(|e| bad(long, e))).transpose();
    let text = |long: &str| o.get(long).map(str::to_string);
    Ok(SubmitArgs {
        cpus_per_task: number("cpus-per-task")?,
        mem: size("mem")?,
        mem_per_gpu: size("mem-per-gpu")?,
        mem_per_cpu: size("mem-per-cpu")?,
        ntasks: number("ntasks")?,
        ntasks_per_node: number("ntasks-per-node")?,
        gpus_per_task: number("gpus-per-task")?,
        gpu_fraction: None,
        output: text("output"),
        error: text("error"),
        gpus,
        nodes: number("nodes")?.unwrap_or(1),
        name,
        time: o.get("time").map(|t| parse_time(t).map_err(|e| bad("time", e))).transpose()?,
        qos: text("qos"),
        profile: None,
        env: Vec::new(),
        export,
        // The submit directory unless --chdir (set at the submit, as for `kairos submit`).
        workdir: text("chdir"),
        requeue: o.get("requeue").is_some(),
        after_ok: Vec::new(),
        after_any: Vec::new(),
        after_not_ok: Vec::new(),
        dependency,
        hold: o.get("hold").is_some(),
        gpu_model,
        topology: o.get("switches").map(|s| switches(s).map_err(|e| bad("switches", e))).transpose()?,
        account: text("account"),
        partition: text("partition"),
        reservation: text("reservation"),
        min_gpus: None,
        min_nodes: None,
        suspendable: false,
        checkpoint_signal,
        checkpoint_grace: None,
        array: o.get("array").map(|a| parse_array(a).map_err(|e| bad("array", e))).transpose()?,
        container_mounts: o
            .get("container-mounts")
            .map(|m| m.split(',').filter(|m| !m.is_empty()).map(str::to_string).collect())
            .unwrap_or_default(),
        container_workdir: text("container-workdir"),
        container_image: text("container-image"),
        manifest: None,
        command,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script(dir: &std::path::Path, text: &str) -> String {
        let path = dir.join("job.sh");
        std::fs::write(&path, text).unwrap();
        path.display().to_string()
    }

    #[test]
    fn directives_and_the_command_line_make_the_submit() {
        let dir = tempfile::tempdir().unwrap();
        let path = script(
            dir.path(),
            "#!/bin/bash\n#SBATCH -J train --gres=gpu:h100:2\n#SBATCH --time=0-00:05:00 # five minutes\n\
             #KAIROS --array=0-7%2\n# a comment\n\n#SBATCH --requeue\necho hi\n#SBATCH --qos=ignored-after-the-block\n",
        );
        let args = vec!["--time".to_string(), "10".to_string(), path.clone(), "x".to_string()];
        let s = submit_args(&args, &BTreeMap::new()).unwrap();
        assert_eq!((s.name.as_str(), s.gpus, s.gpu_model.as_deref()), ("train", 2, Some("h100")));
        assert_eq!(s.time, Some(600), "the command line wins");
        assert_eq!(s.array, Some(((0..8).collect(), Some(2))));
        assert!(s.requeue && s.qos.is_none());
        assert_eq!(s.command[..2], ["/bin/bash".to_string(), "-c".to_string()]);
        assert_eq!(s.command[3..], [path, "x".to_string()]);
    }

    #[test]
    fn switches_ask_for_leaf_domains_relaxed_after_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let path = script(dir.path(), "#!/bin/sh\n#SBATCH -N 3 --switches=1@5:00\ntrue\n");
        let s = submit_args(std::slice::from_ref(&path), &BTreeMap::new()).unwrap();
        let t = s.topology.unwrap();
        assert_eq!((t.level.as_str(), t.required, t.max_domains, t.relax_after_s), ("", true, 1, 300));
        let bad = script(dir.path(), "#!/bin/sh\n#SBATCH --switches=0\ntrue\n");
        let e = submit_args(std::slice::from_ref(&bad), &BTreeMap::new()).unwrap_err();
        assert!(e.contains("--switches: the count of switches must be 1 to 64"), "{e}");
    }

    #[test]
    fn an_unsupported_directive_is_refused_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = script(dir.path(), "#!/bin/sh\n#SBATCH --licenses=matlab:1\ntrue\n");
        let e = submit_args(std::slice::from_ref(&path), &BTreeMap::new()).unwrap_err();
        assert!(e.contains("unsupported option --licenses (") && e.contains(":2)"), "{e}");
        let e = submit_args(&["-x".into(), path], &BTreeMap::new()).unwrap_err();
        assert!(e.contains("-x (command line)"), "{e}");
    }

    #[test]
    fn every_unsupported_option_is_named_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = script(
            dir.path(),
            "#!/bin/sh
#SBATCH --licenses=matlab:1
#SBATCH -c 2 --mem 1G
#SBATCH --exclusive
             #SBATCH --nodelist n1
true
",
        );
        let e = submit_args(std::slice::from_ref(&path), &BTreeMap::new()).unwrap_err();
        for option in ["--licenses (", "--exclusive (", "--nodelist ("] {
            assert!(e.contains(option), "{option} missing from: {e}");
        }
        assert!(e.starts_with("unsupported options ") && e.ends_with("nothing was submitted"), "{e}");
    }

    #[test]
    fn slurm_resource_options_make_per_node_cpus_memory_and_gpus() {
        let dir = tempfile::tempdir().unwrap();
        let path = script(
            dir.path(),
            "#!/bin/sh
#SBATCH -n 8 --ntasks-per-node=4 -c 2 --mem-per-cpu=1G
             #SBATCH --gpus-per-task=1 --mail-type=END --mail-user=a@b
#SBATCH --constraint=V100M16|V100M32
true
",
        );
        let s = submit_args(std::slice::from_ref(&path), &BTreeMap::new()).unwrap();
        let shape = crate::jobs::shape_of(&s).unwrap();
        assert_eq!(shape, crate::jobs::Shape { gpus: 4, cpus: 8, mem_mib: 8192, nodes: Some(2) });
        assert_eq!(s.gpu_model.as_deref(), Some("V100M16|V100M32"));
        // No GPU option: a CPU-only job (sbatch's default), one CPU.
        let path = script(
            dir.path(),
            "#!/bin/sh
#SBATCH --mem 256M
true
",
        );
        let s = submit_args(std::slice::from_ref(&path), &BTreeMap::new()).unwrap();
        let shape = crate::jobs::shape_of(&s).unwrap();
        assert_eq!(shape, crate::jobs::Shape { gpus: 0, cpus: 1, mem_mib: 256, nodes: None });
    }

    #[test]
    fn a_reservation_is_named_in_either_spelling_and_the_command_line_wins() {
        let dir = tempfile::tempdir().unwrap();
        for line in
            ["#SBATCH --reservation=maint", "#SBATCH --reservation maint", "#KAIROS --reservation 'maint'"]
        {
            let path = script(dir.path(), &format!("#!/bin/sh\n{line}\ntrue\n"));
            let s = submit_args(std::slice::from_ref(&path), &BTreeMap::new()).unwrap();
            assert_eq!(s.reservation.as_deref(), Some("maint"), "{line}");
        }
        let path = script(dir.path(), "#!/bin/sh\n#SBATCH --reservation=maint\ntrue\n");
        let s = submit_args(&["--reservation".into(), "other".into(), path], &BTreeMap::new()).unwrap();
        assert_eq!(s.reservation.as_deref(), Some("other"));
        assert!(help().contains("--reservation VALUE"));
    }

    #[test]
    fn directive_words_split_like_a_shell() {
        assert_eq!(words("-J 'a b' --x=\"c d\" # e").unwrap(), ["-J", "a b", "--x=c d"]);
    }
}
