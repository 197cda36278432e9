//! Container Device Interface specs: what a run's GPUs need inside a container — their device
//! nodes, the driver's libraries, environment — as the NVIDIA Container Toolkit writes them
//! (`nvidia-ctk cdi generate`, into `/etc/cdi` or `/var/run/cdi`, YAML or JSON).
//!
//! Only the run's own devices are taken from a spec (by the names `CUDA_VISIBLE_DEVICES` gives
//! them: an index, or a MIG instance's UUID), with the spec's common edits. Hooks are not run.

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The CDI kind of NVIDIA GPUs.
pub const GPU_KIND: &str = "nvidia.com/gpu";

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    kind: String,
    #[serde(default)]
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct ContainerEdits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<DeviceNode>,
    #[serde(default)]
    mounts: Vec<Mount>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct DeviceNode {
    path: String,
    #[serde(default)]
    host_path: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Mount {
    host_path: String,
    container_path: String,
    #[serde(default)]
    options: Vec<String>,
}

/// What a run's devices add to its container.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Edits {
    /// Device nodes: on the host, in the container.
    pub devices: Vec<(PathBuf, String)>,
    /// Bind mounts: on the host, in the container, read-only.
    pub mounts: Vec<(PathBuf, String, bool)>,
    pub env: Vec<(String, String)>,
}

impl Edits {
    fn add(&mut self, e: &ContainerEdits) {
        for d in &e.device_nodes {
            let host = PathBuf::from(d.host_path.as_deref().unwrap_or(&d.path));
            if !self.devices.iter().any(|(_, inside)| *inside == d.path) {
                self.devices.push((host, d.path.clone()));
            }
        }
        for m in &e.mounts {
            if !self.mounts.iter().any(|(_, inside, _)| *inside == m.container_path) {
                let ro = m.options.iter().any(|o| o == "ro");
                self.mounts.push((PathBuf::from(&m.host_path), m.container_path.clone(), ro));
            }
        }
        for kv in &e.env {
            if let Some((k, v)) = kv.split_once('=') {
                self.env.push((k.to_string(), v.to_string()));
            }
        }
    }
}

/// The edits for devices `names` of kind `kind` from the specs in `dirs` (later directories
/// win, as CDI orders them); None when no spec of that kind is there, an error when a spec is
/// unreadable or lacks one of the devices.
pub fn edits(dirs: &[PathBuf], kind: &str, names: &[String]) -> Result<Option<Edits>, String> {
    let mut spec = None;
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else { continue };
        let mut files: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "json"))
            .collect();
        files.sort();
        for f in files {
            let s = read(&f)?;
            if s.kind == kind {
                spec = Some((f, s));
            }
        }
    }
    let Some((file, spec)) = spec else { return Ok(None) };
    let mut out = Edits::default();
    out.add(&spec.container_edits);
    for name in names {
        let device = spec.devices.iter().find(|d| d.name == *name).ok_or_else(|| {
            format!("the CDI spec {} has no device \"{name}\" of kind {kind}", file.display())
        })?;
        out.add(&device.container_edits);
    }
    Ok(Some(out))
}

fn read(path: &Path) -> Result<Spec, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    // YAML is a superset of JSON: one parser reads both.
    serde_yaml_ng::from_str(&text).map_err(|e| format!("the CDI spec {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
cdiVersion: 0.5.0
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia0
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/nvidia1
      hostPath: /srv/fake/nvidia1
containerEdits:
  env:
  - NVIDIA_VISIBLE_DEVICES=void
  deviceNodes:
  - path: /dev/nvidiactl
  mounts:
  - hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54
    containerPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54
    options: [ro, nosuid, nodev, bind]
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
"#;

    #[test]
    fn only_the_runs_devices_are_taken_with_the_common_edits() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("nvidia.yaml"), SPEC).unwrap();
        std::fs::write(
            dir.path().join("other.json"),
            r#"{"cdiVersion":"0.5.0","kind":"vendor.com/fpga","devices":[]}"#,
        )
        .unwrap();
        let dirs = [dir.path().to_path_buf()];
        let e = edits(&dirs, GPU_KIND, &["1".into()]).unwrap().unwrap();
        assert_eq!(
            e.devices,
            [
                (PathBuf::from("/dev/nvidiactl"), "/dev/nvidiactl".to_string()),
                ("/srv/fake/nvidia1".into(), "/dev/nvidia1".into())
            ]
        );
        assert_eq!(e.mounts.len(), 1);
        assert!(e.mounts[0].2, "read-only as the spec says");
        assert_eq!(e.env, [("NVIDIA_VISIBLE_DEVICES".to_string(), "void".to_string())]);
        assert!(edits(&dirs, GPU_KIND, &["7".into()]).unwrap_err().contains("no device \"7\""));
        assert_eq!(edits(&dirs, "amd.com/gpu", &["0".into()]).unwrap(), None);
        assert_eq!(edits(&[dir.path().join("none")], GPU_KIND, &["0".into()]).unwrap(), None);
        std::fs::write(dir.path().join("broken.yaml"), "kind: [").unwrap();
        assert!(edits(&dirs, GPU_KIND, &["0".into()]).unwrap_err().contains("broken.yaml"));
    }
}
