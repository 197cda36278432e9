//! Decayed usage: the GPU-milliseconds each account was charged (when its runs ended), halved
//! every half-life, in fixed point so every replica computes the same numbers. Recorded in the
//! state (`ClusterState::usage`); fairshare (`crate::priority`) reads it.

use serde::{Deserialize, Serialize};

/// Fixed-point one: factors are integers in [0, ONE].
pub const ONE: u64 = 1 << 16;

/// 2^(−i/16) in Q32, i = 0..16.
const POW2_NEG_SIXTEENTHS: [u64; 17] = [
    4294967296, 4112874773, 3938502376, 3771522796, 3611622603, 3458501653, 3311872529, 3171459999,
    3037000500, 2908241642, 2784941738, 2666869351, 2553802834, 2445529907, 2341847242, 2242560098,
    2147483648,
];

/// 2^(−x) for x ≥ 0 given in Q16 (x = num / ONE), as a Q16 value.
pub fn pow2_neg(x_q16: u64) -> u64 {
    let whole = x_q16 >> 16;
    if whole >= 48 {
        return 0;
    }
    let frac = x_q16 & 0xFFFF; // in 1/65536 units
    let step = (frac >> 12) as usize; // sixteenths
    let rest = frac & 0xFFF; // within the sixteenth, in 1/4096
    let (a, b) = (POW2_NEG_SIXTEENTHS[step], POW2_NEG_SIXTEENTHS[step + 1]);
    let q32 = a - (((a - b) * rest) >> 12);
    (q32 >> whole) >> 16
}

/// Decayed usage of one account.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AccountUsage {
    /// GPU-milliseconds, decayed to `as_of_ms`.
    pub gpu_ms: u128,
    pub as_of_ms: i64,
}

impl AccountUsage {
    /// The usage decayed to `now_ms`.
    pub fn at(&self, now_ms: i64, half_life_s: u64) -> u128 {
        let dt = now_ms.saturating_sub(self.as_of_ms).max(0) as u128;
        let half_life_ms = u128::from(half_life_s.max(1)) * 1000;
        let x_q16 = (dt * u128::from(ONE) / half_life_ms).min(u128::from(u64::MAX)) as u64;
        self.gpu_ms * u128::from(pow2_neg(x_q16)) / u128::from(ONE)
    }

    pub fn charge(&mut self, gpu_ms: u128, now_ms: i64, half_life_s: u64) {
        self.gpu_ms = self.at(now_ms, half_life_s) + gpu_ms;
        self.as_of_ms = self.as_of_ms.max(now_ms);
    }
}
