//! Interactive sessions (docs/interactive.md): `exec` and `attach` (`exec`), `alloc` and
//! `run` (`alloc`), `port-forward` (`forward`) and `notebook` (`notebook`), all over
//! `JobService.Session` streams that `stream` keeps alive across controller failovers;
//! `terminal` owns the local terminal.

pub mod alloc;
pub mod exec;
pub mod forward;
pub mod notebook;
pub mod stream;
pub mod terminal;

use kairos_proto::v1 as pb;

/// The CLI's exit status for a session's end: the command's code, 128 + N for signal N, 1
/// when there is neither (the session ended other than by its command).
pub fn exit_status(exit: &pb::SessionExit) -> i32 {
    if exit.signal > 0 {
        128 + exit.signal.min(127)
    } else if exit.code >= 0 {
        exit.code.min(255)
    } else {
        1
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod resume_tests;
