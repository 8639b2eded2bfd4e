//! An eventfd the HTTP threads ring when an attempt finishes, so the main thread can sleep on
//! its latch and this descriptor at once (PostgreSQL's `WaitLatchOrSocket`).

use std::io;
use std::os::fd::RawFd;

#[derive(Debug)]
pub struct Doorbell(RawFd);

impl Doorbell {
    pub fn new() -> io::Result<Doorbell> {
        // SAFETY: eventfd takes no pointers; a negative result is checked below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Doorbell(fd))
    }

    pub fn fd(&self) -> RawFd {
        self.0
    }

    /// Safe from any thread: a plain write(2), no PostgreSQL call.
    pub fn ring(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a local u64 to the eventfd this value owns.
        unsafe { libc::write(self.0, (&one as *const u64).cast(), 8) };
    }

    /// Resets the counter so the descriptor stops reading as ready.
    pub fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads at most 8 bytes into a local u64 from the eventfd this value owns.
        unsafe { libc::read(self.0, (&mut count as *mut u64).cast(), 8) };
    }
}

impl Drop for Doorbell {
    fn drop(&mut self) {
        // SAFETY: the descriptor is this value's own, closed once, here.
        unsafe { libc::close(self.0) };
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
    fn ring_makes_it_readable_and_clear_resets_it() {
        let bell = Doorbell::new().unwrap();
        assert!(!readable(bell.fd()));
        bell.ring();
        bell.ring();
        assert!(readable(bell.fd()));
        bell.clear();
        assert!(!readable(bell.fd()));
    }
}
