//! dcgm-exporter's HPC job mapping (`kairos-agent --hpc-job-mapping-dir DIR`): one file per GPU,
//! named by its index, holding the ids of the jobs running on it, one per line; a GPU no job
//! runs on has no file. dcgm-exporter (its own `--hpc-job-mapping-dir`) reads them and labels
//! that GPU's metrics with the job, so GPU telemetry is attributable to kairos jobs.

use std::collections::BTreeMap;
use std::path::Path;

/// Makes `dir` say which jobs run on which GPU: `runs` are (job id, its GPUs). Each file is
/// replaced whole (written aside, then renamed), so a reader never sees half of one.
pub fn write(dir: &Path, runs: &[(u64, Vec<u32>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut by_gpu: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
    for (job, gpus) in runs {
        for g in gpus {
            by_gpu.entry(*g).or_default().push(*job);
        }
    }
    for (gpu, mut jobs) in by_gpu.clone() {
        jobs.sort_unstable();
        jobs.dedup();
        let text: String = jobs.iter().map(|j| format!("{j}\n")).collect();
        let path = dir.join(gpu.to_string());
        if std::fs::read_to_string(&path).ok().as_deref() == Some(text.as_str()) {
            continue;
        }
        let aside = dir.join(format!(".{gpu}.new"));
        std::fs::write(&aside, text)?;
        std::fs::rename(&aside, &path)?;
    }
    // GPUs no job runs on any more lose their file.
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(gpu) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        if !by_gpu.contains_key(&gpu) {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_gpu_file_names_the_jobs_on_it_and_idle_gpus_have_none() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), &[(7, vec![0, 1]), (9, vec![1, 3])]).unwrap();
        let read = |g: &str| std::fs::read_to_string(dir.path().join(g)).ok();
        assert_eq!(read("0").as_deref(), Some("7\n"));
        assert_eq!(read("1").as_deref(), Some("7\n9\n"));
        assert_eq!(read("3").as_deref(), Some("9\n"));
        assert_eq!(read("2"), None);
        // Job 7 ended: its GPUs are free again, or only job 9's.
        write(dir.path(), &[(9, vec![1, 3])]).unwrap();
        assert_eq!(read("0"), None);
        assert_eq!(read("1").as_deref(), Some("9\n"));
        write(dir.path(), &[]).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "files of idle GPUs remain");
    }
}
