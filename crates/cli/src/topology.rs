//! `kairos topology apply FILE | show` and `kairos nodes --topology`: the levels above the nodes
//! (racks, blocks, NVLink domains) and where each node is. A topology file (TOML) names the
//! levels, lowest first, and lists each domain's nodes:
//!
//! ```toml
//! levels = ["rack", "block"]
//!
//! [rack]
//! r1 = ["n1", "n2", "n3"]
//! r2 = ["n4", "n5", "n6"]
//!
//! [block]
//! b1 = ["n1", "n2", "n3", "n4", "n5", "n6"]
//! ```
//!
//! A node the file leaves out of a level is placed by its label of the level's name
//! (`kairos-agent --label rack=r3`).

use std::collections::BTreeMap;

use anyhow::{anyhow, bail, Context};
use clap::Subcommand;
use kairos_proto::v1 as pb;
use serde_json::json;

use crate::client::Client;
use crate::output::{print_json, table};

#[derive(Subcommand, Debug)]
pub enum TopologyCmd {
    /// Replace the topology with a file's (operators): levels, lowest first, and each
    /// domain's nodes. Nodes it names that are not registered are listed.
    Apply {
        /// The topology file (TOML).
        file: std::path::PathBuf,
    },
    /// The levels and every node's domain at each (the file's, else its labels').
    Show,
}

/// Most bytes of a topology file read (the controllers take requests of up to 4 MiB).
const FILE_MAX: u64 = 3 << 20;

/// A topology file as the request: every node in one domain per level, only named levels.
pub fn parse_file(text: &str) -> anyhow::Result<pb::Topology> {
    let table: toml::Table = toml::from_str(text).map_err(|e| anyhow!("{}", e.message()))?;
    let mut levels = Vec::new();
    let mut nodes: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (key, value) in &table {
        if key == "levels" {
            let list =
                value.as_array().ok_or_else(|| anyhow!("levels: a list of level names, lowest first"))?;
            for l in list {
                levels.push(l.as_str().ok_or_else(|| anyhow!("levels: names are strings"))?.to_string());
            }
        }
    }
    for (level, value) in &table {
        if level == "levels" {
            continue;
        }
        if !levels.contains(level) {
            bail!("[{level}]: not one of the levels ({})", levels.join(", "));
        }
        let domains = value.as_table().ok_or_else(|| anyhow!("[{level}]: DOMAIN = [NODES] entries"))?;
        for (domain, members) in domains {
            let members =
                members.as_array().ok_or_else(|| anyhow!("{level} {domain}: a list of node names"))?;
            for m in members {
                let node = m.as_str().ok_or_else(|| anyhow!("{level} {domain}: node names are strings"))?;
                let placed = nodes.entry(node.to_string()).or_default();
                if let Some(other) = placed.insert(level.clone(), domain.clone()) {
                    bail!("node {node} is in {level} {other} and {level} {domain}: one {level} per node");
                }
            }
        }
    }
    let nodes = nodes
        .into_iter()
        .map(|(node, domains)| pb::TopologyNode { node, domains: domains.into_iter().collect() });
    Ok(pb::Topology { levels, nodes: nodes.collect(), ..Default::default() })
}

pub async fn command(client: &Client, json: bool, cmd: TopologyCmd) -> anyhow::Result<i32> {
    match cmd {
        TopologyCmd::Apply { file } => {
            let text = read_bounded(&file)?;
            let request = parse_file(&text).map_err(|e| anyhow!("{}: {e:#}", file.display()))?;
            let answer =
                client.admin(request, |mut c, r| async move { c.set_topology(r).await }).await?.into_inner();
            if json {
                print_json(&topology_json(&answer));
            } else {
                println!(
                    "topology applied: levels {}, {} nodes placed by the file",
                    answer.levels.join(", "),
                    answer.nodes.len()
                );
                if !answer.unknown_nodes.is_empty() {
                    println!("not registered (yet): {}", answer.unknown_nodes.join(", "));
                }
            }
        }
        TopologyCmd::Show => {
            let answer = get(client).await?;
            if json {
                print_json(&topology_json(&answer));
            } else {
                let mut header = vec!["NODE"];
                let upper: Vec<String> = answer.levels.iter().map(|l| l.to_uppercase()).collect();
                header.extend(upper.iter().map(String::as_str));
                let rows = answer.resolved.iter().map(|n| {
                    let mut row = vec![n.node.clone()];
                    row.extend(
                        answer.levels.iter().map(|l| n.domains.get(l).cloned().unwrap_or_else(|| "-".into())),
                    );
                    row
                });
                println!(
                    "levels (lowest first): {}",
                    if answer.levels.is_empty() { "none".into() } else { answer.levels.join(", ") }
                );
                table(&header, &rows.collect::<Vec<_>>());
                if !answer.unknown_nodes.is_empty() {
                    println!("placed by the file, not registered: {}", answer.unknown_nodes.join(", "));
                }
            }
        }
    }
    Ok(0)
}

/// The file's text, refused past `FILE_MAX` before it is read whole.
fn read_bounded(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::Read;
    let f = std::fs::File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut text = String::new();
    f.take(FILE_MAX + 1).read_to_string(&mut text).with_context(|| format!("reading {}", path.display()))?;
    if text.len() as u64 > FILE_MAX {
        bail!("{}: larger than {} MiB", path.display(), FILE_MAX >> 20);
    }
    Ok(text)
}

async fn get(client: &Client) -> anyhow::Result<pb::Topology> {
    let req = pb::GetTopologyRequest {};
    Ok(client.admin(req, |mut c, r| async move { c.get_topology(r).await }).await?.into_inner())
}

fn topology_json(t: &pb::Topology) -> serde_json::Value {
    let placed = |ns: &[pb::TopologyNode]| -> serde_json::Value {
        ns.iter().map(|n| (n.node.clone(), json!(n.domains.iter().collect::<BTreeMap<_, _>>()))).collect()
    };
    json!({
        "levels": t.levels,
        "file": placed(&t.nodes),
        "nodes": placed(&t.resolved),
        "unknown_nodes": t.unknown_nodes,
    })
}

/// Free whole GPUs of an Up node (none of a node that is not Up, or is under maintenance).
fn free_gpus(n: &pb::Node) -> usize {
    if n.state != pb::NodeState::Up as i32 || !n.maint.is_empty() {
        return 0;
    }
    let gpus = n.info.as_ref().map_or(0, |i| i.gpus.len());
    let busy = n.allocated.len()
        + n.faults.len()
        + n.shared.iter().map(|s| s.gpu).collect::<std::collections::BTreeSet<_>>().len();
    gpus.saturating_sub(busy)
}

/// `kairos nodes --topology`: the tree, highest level first, with free GPUs per domain.
pub async fn tree(client: &Client, json: bool) -> anyhow::Result<i32> {
    let topology = get(client).await?;
    let nodes = client
        .admin(pb::ListNodesRequest {}, |mut c, r| async move { c.list_nodes(r).await })
        .await?
        .into_inner()
        .nodes;
    let domains: BTreeMap<&str, &pb::TopologyNode> =
        topology.resolved.iter().map(|n| (n.node.as_str(), n)).collect();
    // Path of each node, highest level first ("-" where it has no domain).
    let mut rows: Vec<(Vec<String>, &pb::Node)> = nodes
        .iter()
        .map(|n| {
            let d = domains.get(n.name.as_str());
            let path = topology
                .levels
                .iter()
                .rev()
                .map(|l| d.and_then(|d| d.domains.get(l)).cloned().unwrap_or_else(|| "-".into()))
                .collect();
            (path, n)
        })
        .collect();
    rows.sort_by(|a, b| (&a.0, &a.1.name).cmp(&(&b.0, &b.1.name)));
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|(path, n)| {
                let at: BTreeMap<&String, &String> = topology.levels.iter().rev().zip(path).collect();
                json!({"node": n.name, "domains": at, "free_gpus": free_gpus(n)})
            })
            .collect();
        print_json(&json!(out));
        return Ok(0);
    }
    print!(
        "{}",
        render_tree(
            &topology.levels,
            &rows.iter().map(|(p, n)| (p.clone(), n.name.clone(), free_gpus(n))).collect::<Vec<_>>()
        )
    );
    Ok(0)
}

/// The tree as text: each domain (highest level first) with its free GPUs, then its nodes.
pub fn render_tree(levels: &[String], rows: &[(Vec<String>, String, usize)]) -> String {
    let mut out = String::new();
    let mut open: Vec<String> = Vec::new();
    let upper: Vec<&String> = levels.iter().rev().collect();
    for (path, node, free) in rows {
        for (depth, domain) in path.iter().enumerate() {
            if open.get(depth) == Some(domain) {
                continue;
            }
            open.truncate(depth);
            open.push(domain.clone());
            let inside = rows.iter().filter(|(p, _, _)| p[..=depth] == path[..=depth]);
            let (count, gpus) = inside.fold((0, 0), |(c, g), (_, _, f)| (c + 1, g + f));
            out.push_str(&format!(
                "{}{} {domain}: {gpus} GPUs free on {count} nodes\n",
                "  ".repeat(depth),
                upper[depth]
            ));
        }
        out.push_str(&format!("{}{node}: {free} GPUs free\n", "  ".repeat(path.len())));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_places_nodes_and_a_node_in_two_racks_or_an_unnamed_level_is_refused() {
        let t = parse_file("levels = [\"rack\", \"block\"]\n[rack]\nr1 = [\"n1\", \"n2\"]\nr2 = [\"n3\"]\n[block]\nb1 = [\"n1\", \"n2\", \"n3\"]\n").unwrap();
        assert_eq!(t.levels, ["rack", "block"]);
        let n1 = t.nodes.iter().find(|n| n.node == "n1").unwrap();
        assert_eq!((n1.domains["rack"].as_str(), n1.domains["block"].as_str()), ("r1", "b1"));
        let e = parse_file("levels = [\"rack\"]\n[rack]\nr1 = [\"n1\"]\nr2 = [\"n1\"]\n").unwrap_err();
        assert!(e.to_string().contains("node n1 is in rack r1 and rack r2"), "{e}");
        let e = parse_file("levels = [\"rack\"]\n[pod]\np1 = [\"n1\"]\n").unwrap_err();
        assert!(e.to_string().contains("[pod]: not one of the levels"), "{e}");
    }

    #[test]
    fn the_tree_sums_free_gpus_per_domain() {
        let levels = vec!["rack".to_string()];
        let rows = vec![
            (vec!["r1".to_string()], "n1".to_string(), 8),
            (vec!["r1".to_string()], "n2".to_string(), 2),
            (vec!["r2".to_string()], "n3".to_string(), 0),
        ];
        let text = render_tree(&levels, &rows);
        assert_eq!(
            text,
            "rack r1: 10 GPUs free on 2 nodes\n  n1: 8 GPUs free\n  n2: 2 GPUs free\nrack r2: 0 GPUs free on 1 nodes\n  n3: 0 GPUs free\n"
        );
    }
}
