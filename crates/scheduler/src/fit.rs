//! The one fit check: whether one task fits in what a node has free — its whole GPUs, its CPUs
//! and its memory, or a fraction of one GPU. A pure function of the node's free resources and
//! the ask, as Nomad's `AllocsFit`: the planner calls it to choose nodes (placement, gangs,
//! reservations, preemption, growth), apply calls it in `check_grant` to re-judge every grant,
//! and submit calls it to refuse a job no node could ever hold. What is free is each caller's
//! own reckoning (the planner's pass, apply's state, a node's capacity); the verdict is here.

use serde::{Deserialize, Serialize};

/// Thousandths of a GPU: a whole GPU.
pub const GPU_MILLI: u32 = 1000;

/// The CPUs and host memory one task of a job holds on its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct CpuMem {
    pub cpus: u32,
    pub mem_mib: u64,
}

/// What one node has free for one task.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeFree {
    /// Whole GPUs (of the task's model set) it may take.
    pub gpus: usize,
    pub cpu_mem: CpuMem,
}

/// What one task asks of its node.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskAsk {
    /// Whole GPUs (0 for a CPU-only task or a fraction, see `fraction_fits`).
    pub gpus: usize,
    pub cpu_mem: CpuMem,
}

/// The first resource (GPUs, CPUs, memory, in that order) that does not fit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Misfit {
    #[error("{free} GPUs free, {wanted} wanted")]
    Gpus { free: usize, wanted: usize },
    #[error("{free} CPUs free, {wanted} wanted")]
    Cpus { free: u32, wanted: u32 },
    #[error("{free} MiB of memory free, {wanted} wanted")]
    Memory { free: u64, wanted: u64 },
    #[error("{free} thousandths of the GPU free, {wanted} wanted")]
    Fraction { free: u32, wanted: u32 },
}

/// Whether the task `ask` fits in `free`: the leaf every fit decision of the crate ends in.
pub fn fits(free: &NodeFree, ask: &TaskAsk) -> Result<(), Misfit> {
    if ask.gpus > free.gpus {
        return Err(Misfit::Gpus { free: free.gpus, wanted: ask.gpus });
    }
    if ask.cpu_mem.cpus > free.cpu_mem.cpus {
        return Err(Misfit::Cpus { free: free.cpu_mem.cpus, wanted: ask.cpu_mem.cpus });
    }
    if ask.cpu_mem.mem_mib > free.cpu_mem.mem_mib {
        return Err(Misfit::Memory { free: free.cpu_mem.mem_mib, wanted: ask.cpu_mem.mem_mib });
    }
    Ok(())
}

/// Whether a fraction of `milli` thousandths fits on a GPU of which fractions hold `used`.
pub fn fraction_fits(used: u32, milli: u32) -> Result<(), Misfit> {
    let free = GPU_MILLI - used.min(GPU_MILLI);
    if milli > free {
        return Err(Misfit::Fraction { free, wanted: milli });
    }
    Ok(())
}

impl CpuMem {
    /// Whether `self` fits in `free` (the CPUs and memory of `fits`).
    pub fn fits(self, free: CpuMem) -> bool {
        self.short_of(free).is_none()
    }

    /// `self` less `other`, never below zero.
    pub fn minus(self, other: CpuMem) -> CpuMem {
        CpuMem {
            cpus: self.cpus.saturating_sub(other.cpus),
            mem_mib: self.mem_mib.saturating_sub(other.mem_mib),
        }
    }

    pub fn plus(self, other: CpuMem) -> CpuMem {
        CpuMem {
            cpus: self.cpus.saturating_add(other.cpus),
            mem_mib: self.mem_mib.saturating_add(other.mem_mib),
        }
    }

    /// Which resource of `self` does not fit in `free` ("CPUs" first), for pending reasons.
    pub fn short_of(self, free: CpuMem) -> Option<&'static str> {
        let (free, ask) = (NodeFree { gpus: 0, cpu_mem: free }, TaskAsk { gpus: 0, cpu_mem: self });
        match fits(&free, &ask) {
            Err(Misfit::Cpus { .. }) => Some("CPUs"),
            Err(Misfit::Memory { .. }) => Some("memory"),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cm(cpus: u32, mem_mib: u64) -> CpuMem {
        CpuMem { cpus, mem_mib }
    }

    #[test]
    fn the_first_short_resource_is_named_and_equal_fits() {
        let free = NodeFree { gpus: 2, cpu_mem: cm(8, 100) };
        let ask = |gpus, cpus, mem| TaskAsk { gpus, cpu_mem: cm(cpus, mem) };
        assert_eq!(fits(&free, &ask(2, 8, 100)), Ok(()), "exactly what is free fits");
        assert_eq!(fits(&free, &ask(3, 9, 101)), Err(Misfit::Gpus { free: 2, wanted: 3 }));
        assert_eq!(fits(&free, &ask(2, 9, 101)), Err(Misfit::Cpus { free: 8, wanted: 9 }));
        assert_eq!(fits(&free, &ask(0, 8, 101)), Err(Misfit::Memory { free: 100, wanted: 101 }));
        assert_eq!(cm(9, 0).short_of(cm(8, 0)), Some("CPUs"));
        assert_eq!(cm(8, 101).short_of(cm(8, 100)), Some("memory"));
        assert!(cm(8, 100).fits(cm(8, 100)) && !cm(8, 100).fits(cm(7, 100)));
    }

    #[test]
    fn a_fraction_fits_beside_others_up_to_a_whole_gpu() {
        assert_eq!(fraction_fits(750, 250), Ok(()));
        assert_eq!(fraction_fits(750, 251), Err(Misfit::Fraction { free: 250, wanted: 251 }));
        assert_eq!(fraction_fits(1200, 1), Err(Misfit::Fraction { free: 0, wanted: 1 }));
    }
}
