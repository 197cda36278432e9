//! Daemon config files: `--config FILE.toml` holds the long flags as keys with underscores
//! (`data_dir`, `cluster_secret_file`, `advertise_addr`, …) and values written as on the command
//! line (`peers = "1=10.0.0.1:7001,2=10.0.0.2:7001"`, `fake_gpus = "8"`, `port = 7001`,
//! `run_as_root = true`, `label = ["rack=r1", "zone=a"]` for a repeatable flag). A flag given on
//! the command line wins over the file. The file becomes flags before clap parses, so it is
//! validated exactly as the command line is; an unknown key is refused, naming it and the file.

use std::ffi::OsString;

/// Largest config file read.
const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// `argv` with the keys of its `--config FILE` (if any) inserted as flags before the command
/// line's own, except those the command line sets itself.
pub fn expand(argv: Vec<OsString>, cmd: &clap::Command) -> Result<Vec<OsString>, String> {
    let args: Vec<String> = argv.iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut file = None;
    for (i, a) in args.iter().enumerate().skip(1) {
        if a == "--config" {
            file = args.get(i + 1).cloned();
        } else if let Some(f) = a.strip_prefix("--config=") {
            file = Some(f.to_string());
        }
    }
    let Some(file) = file else { return Ok(argv) };
    let too_big = std::fs::metadata(&file).map(|m| m.len() > CONFIG_BYTES_MAX).unwrap_or(false);
    if too_big {
        return Err(format!("{file}: larger than {CONFIG_BYTES_MAX} bytes"));
    }
    let text = std::fs::read_to_string(&file).map_err(|e| format!("reading {file}: {e}"))?;
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        format!("{file}: {}", e.message().lines().next().unwrap_or("not TOML"))
    })?;
    let given = |flag: &str| args.iter().skip(1).any(|a| a == flag || a.starts_with(&format!("{flag}=")));
    let mut from_file: Vec<OsString> = Vec::new();
    for (key, value) in &table {
        let long = key.replace('_', "-");
        let arg = cmd
            .get_arguments()
            .find(|a| a.get_long() == Some(long.as_str()) && long != "config")
            .ok_or_else(|| format!("{file}: unknown key \"{key}\""))?;
        let flag = format!("--{long}");
        if given(&flag) {
            continue;
        }
        let takes_value = arg.get_action().takes_values();
        let scalar = |v: &toml::Value| -> Result<String, String> {
            match v {
                toml::Value::String(s) => Ok(s.clone()),
                toml::Value::Integer(n) => Ok(n.to_string()),
                toml::Value::Float(x) => Ok(x.to_string()),
                toml::Value::Boolean(b) => Ok(b.to_string()),
                _ => Err(format!("{file}: \"{key}\" must be a string, number or boolean")),
            }
        };
        match value {
            toml::Value::Boolean(b) if !takes_value => {
                if *b {
                    from_file.push(flag.into());
                }
            }
            toml::Value::Array(items) => {
                for item in items {
                    from_file.push(flag.clone().into());
                    from_file.push(scalar(item)?.into());
                }
            }
            v if takes_value => {
                from_file.push(flag.into());
                from_file.push(scalar(v)?.into());
            }
            _ => return Err(format!("{file}: \"{key}\" is a switch: true or false")),
        }
    }
    let mut out = vec![argv[0].clone()];
    out.extend(from_file);
    out.extend(argv.into_iter().skip(1));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Parser, Debug)]
    struct Args {
        #[arg(long)]
        config: Option<String>,
        #[arg(long, default_value = "data")]
        data_dir: String,
        #[arg(long, default_value_t = 1)]
        id: u64,
        #[arg(long)]
        join: bool,
        #[arg(long = "label")]
        labels: Vec<String>,
    }

    fn parse(file: &str, cli: &[&str]) -> Result<Args, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, file).unwrap();
        let mut argv: Vec<OsString> = vec!["d".into(), "--config".into(), path.clone().into()];
        argv.extend(cli.iter().map(OsString::from));
        let argv = expand(argv, &Args::command())?;
        Args::try_parse_from(argv).map_err(|e| e.to_string())
    }

    #[test]
    fn file_keys_become_flags_and_the_command_line_wins() {
        let a = parse("data_dir = \"/srv/k\"\nid = 3\njoin = true\nlabel = [\"rack=r1\", \"zone=a\"]\n", &[])
            .unwrap();
        assert_eq!((a.data_dir.as_str(), a.id, a.join), ("/srv/k", 3, true));
        assert_eq!(a.labels, ["rack=r1", "zone=a"]);
        let a = parse("data_dir = \"/srv/k\"\nid = 3\n", &["--id", "5"]).unwrap();
        assert_eq!((a.data_dir.as_str(), a.id), ("/srv/k", 5));
        let a = parse("join = false\n", &[]).unwrap();
        assert!(!a.join);
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_naming_them() {
        let err = parse("colour = \"red\"\n", &[]).unwrap_err();
        assert!(err.contains("unknown key \"colour\""), "{err}");
        let err = parse("id = \"three\"\n", &[]).unwrap_err();
        assert!(err.contains("three"), "{err}");
        let err = parse("data_dir = \n", &[]).unwrap_err();
        assert!(err.contains("c.toml"), "{err}");
        let err = parse("join = 1\n", &[]).unwrap_err();
        assert!(err.contains("switch"), "{err}");
    }
}
