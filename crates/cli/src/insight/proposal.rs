//! The advice written into the current policy: the whole policy file with the advised settings
//! changed, each changed line marked `# advised (was …)` and each class's evidence as comments
//! above its table — a file `kairos policy apply --dry-run` (and `apply`) reads as it is.

use std::collections::BTreeMap;

use super::advise::{ClassAdvice, Setting};
use super::neat;
use crate::policy_file::PolicyFile;

/// The policy with every advised setting applied.
pub fn apply(file: &mut PolicyFile, advice: &[ClassAdvice]) {
    for class in advice {
        for change in &class.changes {
            set(file, &class.table, &change.setting);
        }
    }
}

fn set(file: &mut PolicyFile, table: &str, setting: &Setting) {
    if let Some(name) = table.strip_prefix("qos.") {
        let Some(q) = file.qos.get_mut(name) else { return };
        match setting {
            Setting::MaxWall(s) => q.max_wall = neat::duration_text(*s),
            Setting::DefCpusPerGpu(c) => q.def_cpus_per_gpu = Some(*c),
            Setting::DefMemPerGpu(m) => q.def_mem_per_gpu = Some(neat::mem_arg(*m)),
            Setting::IdleGpu(i) => q.idle_gpu = Some(i.clone()),
        }
    } else if let Some(name) = table.strip_prefix("partitions.") {
        let Some(p) = file.partitions.get_mut(name) else { return };
        match setting {
            Setting::MaxWall(s) => p.max_wall = Some(neat::duration_text(*s)),
            Setting::DefCpusPerGpu(c) => p.def_cpus_per_gpu = Some(*c),
            Setting::DefMemPerGpu(m) => p.def_mem_per_gpu = Some(neat::mem_arg(*m)),
            Setting::IdleGpu(i) => p.idle_gpu = Some(i.clone()),
        }
    }
}

/// The header of the proposed file.
pub fn preamble(window: &str, records: usize) -> String {
    format!(
        "# kairos policy advise: the current policy with what {records} jobs' measured usage ({window})\n\
         # supports; changed lines end in \"# advised\". Check it with `kairos policy apply --dry-run FILE`,\n\
         # apply it with `kairos policy apply FILE`.\n"
    )
}

/// The policy file `file` (advice applied) as TOML, annotated with `advice`.
pub fn render(file: &PolicyFile, advice: &[ClassAdvice], preamble: &str) -> Result<String, String> {
    let text = file.to_toml()?;
    let by_table: BTreeMap<&str, &ClassAdvice> = advice.iter().map(|a| (a.table.as_str(), a)).collect();
    let mut out = String::from(preamble);
    let mut table = String::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('[') && trimmed.ends_with(']') {
            table = trimmed.trim_matches(|c| c == '[' || c == ']').to_string();
            if let Some(a) = by_table.get(table.as_str()) {
                out += &evidence(a);
            }
            let marked = table
                .strip_suffix(".idle_gpu")
                .and_then(|t| by_table.get(t))
                .and_then(|a| was(a, "idle_gpu"));
            out += &mark(line, marked);
            continue;
        }
        let key = trimmed.split_once('=').map(|(k, _)| k.trim()).unwrap_or("");
        let marked = by_table.get(table.as_str()).and_then(|a| was(a, key));
        out += &mark(line, marked);
    }
    Ok(out)
}

fn was(a: &ClassAdvice, key: &str) -> Option<String> {
    a.changes.iter().find(|c| c.setting.key() == key).map(|c| c.was.clone())
}

fn mark(line: &str, was: Option<String>) -> String {
    match was {
        Some(w) => format!("{line}  # advised (was {w})\n"),
        None => format!("{line}\n"),
    }
}

/// A class's evidence as comment lines (before its table).
fn evidence(a: &ClassAdvice) -> String {
    let mut out = format!("\n# advise {}: {} finished jobs measured\n", a.table, a.jobs);
    for c in &a.changes {
        out += &format!("#   {} = {}: {}\n", c.setting.key(), c.setting.text(), c.why);
    }
    for n in &a.notes {
        out += &format!("#   {n}\n");
    }
    out
}
