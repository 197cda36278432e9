//! openraft's async runtime for kairos: tokio, with the random numbers openraft draws (election
//! timeouts) coming from a per-thread generator that a simulation can seed.
//!
//! In a daemon each thread's generator starts from OS entropy, as openraft's default does. The
//! deterministic simulation (`kairos-chaos`) runs a whole cluster on one thread and calls
//! `seed_thread_rng` first, so a schedule's elections replay from its seed.

use std::cell::Cell;
use std::future::Future;
use std::time::Duration;

use openraft::{AsyncRuntime, OptionalSend, TokioInstant, TokioRuntime};

thread_local! {
    static STATE: Cell<u64> = Cell::new(entropy());
}

fn entropy() -> u64 {
    let mut bytes = [0u8; 8];
    // Without entropy the generator still works; only its sequence is predictable.
    let _ = getrandom::fill(&mut bytes);
    u64::from_le_bytes(bytes)
}

/// Makes this thread's generator replay the sequence of `seed`.
pub fn seed_thread_rng(seed: u64) {
    STATE.with(|s| s.set(seed));
}

/// This thread's generator (`kairos_scheduler::seeded`, splitmix64): cheap, and reproducible
/// from its seed.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadRng;

impl rand::RngCore for ThreadRng {
    fn next_u32(&mut self) -> u32 {
        (self.next_u64() >> 32) as u32
    }

    fn next_u64(&mut self) -> u64 {
        STATE.with(|s| {
            let (next, value) = kairos_scheduler::seeded::step(s.get());
            s.set(next);
            value
        })
    }

    fn fill_bytes(&mut self, dest: &mut [u8]) {
        for chunk in dest.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }

    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), rand::Error> {
        self.fill_bytes(dest);
        Ok(())
    }
}

/// tokio, with `ThreadRng` as openraft's random source.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct KairosRuntime;

impl AsyncRuntime for KairosRuntime {
    type JoinError = <TokioRuntime as AsyncRuntime>::JoinError;
    type JoinHandle<T: OptionalSend + 'static> = <TokioRuntime as AsyncRuntime>::JoinHandle<T>;
    type Sleep = <TokioRuntime as AsyncRuntime>::Sleep;
    type Instant = TokioInstant;
    type TimeoutError = <TokioRuntime as AsyncRuntime>::TimeoutError;
    type Timeout<R, T: Future<Output = R> + OptionalSend> = <TokioRuntime as AsyncRuntime>::Timeout<R, T>;
    type ThreadLocalRng = ThreadRng;
    type OneshotSender<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotSender<T>;
    type OneshotReceiver<T: OptionalSend> = <TokioRuntime as AsyncRuntime>::OneshotReceiver<T>;
    type OneshotReceiverError = <TokioRuntime as AsyncRuntime>::OneshotReceiverError;

    fn spawn<T>(future: T) -> Self::JoinHandle<T::Output>
    where
        T: Future + OptionalSend + 'static,
        T::Output: OptionalSend + 'static,
    {
        TokioRuntime::spawn(future)
    }

    fn sleep(duration: Duration) -> Self::Sleep {
        TokioRuntime::sleep(duration)
    }

    fn sleep_until(deadline: Self::Instant) -> Self::Sleep {
        TokioRuntime::sleep_until(deadline)
    }

    fn timeout<R, F: Future<Output = R> + OptionalSend>(
        duration: Duration,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout(duration, future)
    }

    fn timeout_at<R, F: Future<Output = R> + OptionalSend>(
        deadline: Self::Instant,
        future: F,
    ) -> Self::Timeout<R, F> {
        TokioRuntime::timeout_at(deadline, future)
    }

    fn is_panic(join_error: &Self::JoinError) -> bool {
        TokioRuntime::is_panic(join_error)
    }

    fn thread_rng() -> Self::ThreadLocalRng {
        ThreadRng
    }

    fn oneshot<T>() -> (Self::OneshotSender<T>, Self::OneshotReceiver<T>)
    where
        T: OptionalSend,
    {
        TokioRuntime::oneshot()
    }
}

#[cfg(test)]
mod tests {
    use rand::Rng;

    use super::*;

    #[test]
    fn a_seeded_thread_replays_its_draws_and_threads_differ() {
        seed_thread_rng(42);
        let a: Vec<u64> = (0..4).map(|_| KairosRuntime::thread_rng().gen_range(150..300)).collect();
        seed_thread_rng(42);
        let b: Vec<u64> = (0..4).map(|_| KairosRuntime::thread_rng().gen_range(150..300)).collect();
        assert_eq!(a, b);
        seed_thread_rng(43);
        let c: Vec<u64> = (0..4).map(|_| KairosRuntime::thread_rng().gen_range(150..300)).collect();
        assert_ne!(a, c);
        assert!(a.iter().all(|v| (150..300).contains(v)));
    }
}
