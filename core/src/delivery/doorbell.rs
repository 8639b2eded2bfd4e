//! An eventfd the HTTP threads ring when attempts finish, so the main thread can sleep on its
//! latch and this descriptor at once (PostgreSQL's `WaitLatchOrSocket`).
//!
//! It rings once `ring_at` attempts have finished since the main thread last cleared it, not at
//! every one: under load, a turn of the relay loop then takes many results at once instead of
//! one each (a turn costs the same for one as for sixteen).

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub struct Doorbell {
    fd: RawFd,
    /// Attempts finished since the last `clear`.
    unheard: AtomicUsize,
    ring_at: AtomicUsize,
}

impl Doorbell {
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd takes no pointers; a negative result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Doorbell { fd, unheard: AtomicUsize::new(0), ring_at: AtomicUsize::new(1) })
    }

    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// An attempt finished (called after its result was queued): rings when it is the
    /// `ring_at`th since the last `clear`. Safe from any thread: no PostgreSQL call.
    pub fn finished(&self) {
        let heard = self.unheard.fetch_add(1, Ordering::SeqCst) + 1;
        if heard == self.ring_at.load(Ordering::SeqCst) {
            self.ring();
        }
    }

    /// Rings once `count` attempts have finished since the last `clear`, or now if as many
    /// already have.
    pub fn ring_at(&self, count: usize) {
        let count = count.max(1);
        self.ring_at.store(count, Ordering::SeqCst);
        if self.unheard.load(Ordering::SeqCst) >= count {
            self.ring();
        }
    }

    /// Whether an attempt could have finished without ringing it.
    pub fn may_be_silent(&self) -> bool {
        self.ring_at.load(Ordering::SeqCst) > 1
    }

    /// Makes the descriptor read as ready now, whatever the count (the relay process also
    /// rings one at each commit notification): a plain write(2).
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to the eventfd this value owns.
        unsafe { libc::write(self.fd, (&one as *const u64).cast(), 8) };
    }

    /// Resets the count and the counter, so the descriptor stops reading as ready; called
    /// before the finished attempts are taken, so none is taken uncounted.
    pub fn clear(&self) {
        self.unheard.store(0, Ordering::SeqCst);
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a local u64 from the eventfd this value owns.
        unsafe { libc::read(self.fd, (&mut count as *mut u64).cast(), 8) };
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's own, closed once, here.
        unsafe { libc::close(self.fd) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn readable(fd: RawFd) -> bool {
        let mut poll = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        // SAFETY: one pollfd on the stack, no wait.
        unsafe { libc::poll(&mut poll, 1, 0) == 1 }
    }

    #[test]
    fn it_rings_at_the_first_finish_and_clear_resets_it() {
        let bell = Doorbell::new().unwrap();
        assert!(!readable(bell.fd()));
        bell.finished();
        bell.finished();
        assert!(readable(bell.fd()));
        bell.clear();
        assert!(!readable(bell.fd()));
    }

    #[test]
    fn armed_for_three_it_rings_at_the_third_or_at_once_if_three_finished() {
        let bell = Doorbell::new().unwrap();
        bell.ring_at(3);
        assert!(bell.may_be_silent());
        bell.finished();
        bell.finished();
        assert!(!readable(bell.fd()), "two of three");
        bell.finished();
        assert!(readable(bell.fd()), "the third");
        bell.clear();
        bell.ring_at(5);
        (0..4).for_each(|_| bell.finished());
        assert!(!readable(bell.fd()));
        bell.ring_at(2);
        assert!(readable(bell.fd()), "four finished already when armed for two");
        bell.clear();
        bell.ring_at(1);
        assert!(!bell.may_be_silent());
    }
}
