//! `-o`/`-e` (`submit` and `batch`): a job's output sent to files named by sbatch's patterns
//! (`%j %A %a %x %u %N %%`), expanded on the node from the job's Slurm variables.

/// `command` behind a shell that sends its stdout to `output` (default `kairos-%j.out`) and its
/// stderr to `error` (default: with stdout), each an sbatch file name pattern, appending; `arg0` names the
/// shell (`$0`). Unchanged when neither is given.
pub fn redirected(
    command: Vec<String>,
    output: Option<&str>,
    error: Option<&str>,
    arg0: &str,
) -> Vec<String> {
    if output.is_none() && error.is_none() {
        return command;
    }
    let out = output.unwrap_or("kairos-%j.out");
    let (out, err) = (pattern(out), pattern(error.unwrap_or(out)));
    let redirect = format!("exec >>{out} 2>>{err}; exec \"$@\"");
    let mut wrapped = vec!["/bin/sh".to_string(), "-c".to_string(), redirect, arg0.to_string()];
    wrapped.extend(command);
    wrapped
}

/// A double-quoted shell word for an output pattern: `%j` and the others become the job's
/// variables, everything else is literal.
fn pattern(p: &str) -> String {
    let mut out = String::from("\"");
    let mut chars = p.chars();
    while let Some(c) = chars.next() {
        match c {
            '%' => match chars.next() {
                Some('j') => out.push_str("${SLURM_JOB_ID}"),
                Some('A') => out.push_str("${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}"),
                Some('a') => out.push_str("${SLURM_ARRAY_TASK_ID:-4294967294}"),
                Some('x') => out.push_str("${SLURM_JOB_NAME}"),
                Some('u') => out.push_str("${SLURM_JOB_USER}"),
                Some('N') => out.push_str("${KAIROS_NODE}"),
                Some('%') => out.push('%'),
                Some(other) => {
                    out.push('%');
                    out.push(other);
                }
                None => out.push('%'),
            },
            '"' | '\\' | '$' | '`' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_patterns_expand_on_the_node_and_everything_else_is_literal() {
        assert_eq!(
            pattern("/o/arr_%A_%a.out"),
            "\"/o/arr_${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}_${SLURM_ARRAY_TASK_ID:-4294967294}.out\""
        );
        assert_eq!(pattern("$HOME/%%x\"`"), "\"\\$HOME/%x\\\"\\`\"");
        assert_eq!(redirected(vec!["true".into()], None, None, "j"), ["true"], "unchanged without -o/-e");
    }
}
