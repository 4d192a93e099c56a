//! Adaptive polling windows: how long a waiter spins before it sleeps.
//!
//! One rule, KVM's for a halting vCPU (`kvm_vcpu_halt`: grow/shrink of `halt_poll_ns`), used by
//! the daemon's request-queue threads (`--poll-us`) and by the bench's guest side
//! (`--halt-poll-us`). The window starts at zero. After a wait the window did not end:
//! - a wait longer than the maximum halves the window (to zero under [`GROW_START`]): the
//!   other side is slow (an OSD write, an idle guest), spinning would only burn a core;
//! - a shorter wait the window did not cover doubles it (from [`GROW_START`], up to the
//!   maximum): the other side answers within microseconds and a spin would have caught it.
//!
//! A wait the window ended (the spin saw the event) leaves it as it is.

use std::time::{Duration, Instant};

/// Where a window starts growing from (KVM's `halt_poll_ns_grow_start`).
pub const GROW_START: Duration = Duration::from_micros(10);

/// Looks at the awaited condition between two clock reads while spinning.
pub const LOOKS_PER_CLOCK_READ: u32 = 32;

/// How long a spin runs before it first yields the CPU. A yield is a system call (about half
/// a microsecond on a virtualised host), and a spin that yielded every few dozen looks from the
/// start paid it within most round trips it waited for: the answer that came during the yield
/// waited for it. A cached request's round trip takes a microsecond or two on a 2-core host, so
/// most spins end before this; a wait that lasts longer is a slow request or a CPU shared with
/// other work, and from then on the spin yields every few dozen looks, so that the thread it
/// waits for, perhaps queued on this very core, gets it soon.
pub const FIRST_YIELD: Duration = Duration::from_micros(2);

/// What one look at the awaited condition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Look {
    /// It happened: stop spinning.
    Ready,
    /// Not yet: keep spinning.
    NotYet,
    /// It will not happen this way (an error, a shutdown): stop spinning.
    GiveUp,
}

/// Spin for at most `window`, calling `look` until it finds [`Look::Ready`] (true) or
/// [`Look::GiveUp`] (false); false also when the window runs out.
///
/// Every `looks_per_clock_read` looks the clock is read, and from [`FIRST_YIELD`] on the CPU
/// is yielded too: KVM's halt polling stops when another task wants the CPU, and on a small
/// host the thread this spinner waits for may be queued on this very core.
pub fn spin_until(
    window: Duration,
    looks_per_clock_read: u32,
    mut look: impl FnMut() -> Look,
) -> bool {
    let start = Instant::now();
    let deadline = start + window;
    let first_yield = start + FIRST_YIELD;
    loop {
        for _ in 0..looks_per_clock_read.max(1) {
            match look() {
                Look::Ready => return true,
                Look::GiveUp => return false,
                Look::NotYet => std::hint::spin_loop(),
            }
        }
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        if now >= first_yield {
            std::thread::yield_now();
        }
    }
}

/// The polling window of one waiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdaptivePoll {
    max: Duration,
    window: Duration,
}

impl AdaptivePoll {
    /// A window that adapts below `max`; zero turns polling off.
    pub fn new(max: Duration) -> Self {
        AdaptivePoll {
            max,
            window: Duration::ZERO,
        }
    }

    /// How long to spin before the next sleep.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Start from `window` (at most the maximum), as after a run of short waits.
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window.min(self.max);
        self
    }

    /// Account a wait the window did not end: `waited` runs from the start of the spin to the
    /// event that ended the sleep.
    pub fn slept(&mut self, waited: Duration) {
        if self.max.is_zero() {
            return;
        }
        if waited > self.max {
            let half = self.window / 2;
            self.window = if half < GROW_START {
                Duration::ZERO
            } else {
                half
            };
        } else if waited > self.window && self.window < self.max {
            self.window = (self.window * 2).max(GROW_START).min(self.max);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    #[test]
    fn grows_on_short_waits_and_shrinks_on_long_ones() {
        let mut p = AdaptivePoll::new(us(200));
        assert_eq!(p.window(), Duration::ZERO, "starts without polling");
        // Short waits the window did not cover: 10, 20, 40, 80, 160, then capped at 200.
        for want in [10, 20, 40, 80, 160, 200, 200] {
            p.slept(us(190));
            assert_eq!(p.window(), us(want));
        }
        // A wait within the window changes nothing.
        p.slept(us(5));
        assert_eq!(p.window(), us(200));
        // Waits longer than the maximum halve it, to zero under the start value.
        for want in [100, 50, 25, 12, 0, 0] {
            p.slept(us(5000));
            assert_eq!(p.window().as_micros(), want);
        }
    }

    #[test]
    fn spin_until_stops_at_the_first_answer_or_the_window() {
        let mut n = 0;
        assert!(spin_until(Duration::from_secs(10), 4, || {
            n += 1;
            if n == 100 {
                Look::Ready
            } else {
                Look::NotYet
            }
        }));
        assert_eq!(n, 100);
        let mut m = 0;
        assert!(!spin_until(Duration::from_secs(10), 4, || {
            m += 1;
            if m == 7 {
                Look::GiveUp
            } else {
                Look::NotYet
            }
        }));
        assert_eq!(m, 7);
        assert!(!spin_until(us(200), 4, || Look::NotYet));
    }

    #[test]
    fn zero_maximum_never_polls() {
        let mut p = AdaptivePoll::new(Duration::ZERO);
        for w in [1, 5, 100, 10_000] {
            p.slept(us(w));
            assert_eq!(p.window(), Duration::ZERO);
        }
        assert_eq!(
            AdaptivePoll::new(us(50)).with_window(us(80)).window(),
            us(50)
        );
    }
}
