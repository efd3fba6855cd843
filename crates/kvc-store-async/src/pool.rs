//! The worker pool: a bounded crossbeam queue of jobs, `n` threads, an unbounded channel
//! of results. A full queue refuses a job at once (the caller counts a backpressure skip);
//! a job that panics comes back as a failure and its worker keeps running.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{bounded, unbounded, Receiver, Sender, TrySendError};

use crate::error::{Error, Result};

/// What a finished job gives back: its id and the handler's output, or the panic message.
pub(crate) type Done<R> = (u64, std::result::Result<R, String>);

/// A fixed set of workers running one handler.
pub(crate) struct Pool<J: Send + 'static, R: Send + 'static> {
    jobs: Option<Sender<(u64, J)>>,
    done: Receiver<Done<R>>,
    workers: Vec<JoinHandle<()>>,
    peak: AtomicUsize,
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "panic with a non-string payload".to_string()
    }
}

impl<J: Send + 'static, R: Send + 'static> Pool<J, R> {
    /// Starts `threads` workers over a queue of `capacity` jobs.
    pub(crate) fn new(
        threads: usize,
        capacity: usize,
        handler: Arc<dyn Fn(J) -> R + Send + Sync>,
    ) -> Result<Self> {
        let (jtx, jrx) = bounded::<(u64, J)>(capacity);
        let (dtx, drx) = unbounded::<Done<R>>();
        let mut workers = Vec::with_capacity(threads);
        for i in 0..threads {
            let (jrx, dtx, handler) = (jrx.clone(), dtx.clone(), handler.clone());
            let h = std::thread::Builder::new()
                .name(format!("kvc-store-{i}"))
                .spawn(move || {
                    while let Ok((id, job)) = jrx.recv() {
                        let out = catch_unwind(AssertUnwindSafe(|| handler(job)))
                            .map_err(|p| panic_message(p.as_ref()));
                        if dtx.send((id, out)).is_err() {
                            break;
                        }
                    }
                })
                .map_err(|e| Error::Pool {
                    reason: format!("cannot start worker {i}: {e}"),
                })?;
            workers.push(h);
        }
        Ok(Pool {
            jobs: Some(jtx),
            done: drx,
            workers,
            peak: AtomicUsize::new(0),
        })
    }

    /// Queues a job without blocking; gives it back when the queue is full.
    pub(crate) fn try_submit(&self, id: u64, job: J) -> Result<std::result::Result<(), J>> {
        let Some(tx) = &self.jobs else {
            return Err(Error::Pool {
                reason: "the pool is shut down".to_string(),
            });
        };
        match tx.try_send((id, job)) {
            Ok(()) => {
                // Jobs waiting in the channel right after this one joined it (never more
                // than the capacity; a job a worker has taken no longer counts). A separate
                // counter decremented by the worker raced with the channel: the worker
                // frees a slot before it can decrement, so the count could exceed the
                // capacity.
                self.peak.fetch_max(tx.len(), Ordering::AcqRel);
                Ok(Ok(()))
            }
            Err(TrySendError::Full((_, job))) => Ok(Err(job)),
            Err(TrySendError::Disconnected(_)) => Err(Error::Pool {
                reason: "every worker has stopped".to_string(),
            }),
        }
    }

    /// A finished job, if one is ready.
    pub(crate) fn try_done(&self) -> Option<Done<R>> {
        self.done.try_recv().ok()
    }

    /// The next finished job, blocking.
    pub(crate) fn wait_done(&self) -> Result<Done<R>> {
        self.done.recv().map_err(|_| Error::Pool {
            reason: "every worker has stopped".to_string(),
        })
    }

    /// The deepest the queue has been.
    pub(crate) fn peak(&self) -> usize {
        self.peak.load(Ordering::Acquire)
    }
}

impl<J: Send + 'static, R: Send + 'static> Drop for Pool<J, R> {
    fn drop(&mut self) {
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn panics_are_failures_and_workers_survive() {
        let p: Pool<u32, u32> = Pool::new(
            2,
            64,
            Arc::new(|x: u32| {
                if x.is_multiple_of(3) {
                    panic!("job {x} fails");
                }
                x * 2
            }),
        )
        .unwrap();
        for i in 0..30u32 {
            assert!(p.try_submit(u64::from(i), i).unwrap().is_ok());
        }
        let mut ok = 0;
        let mut failed = 0;
        for _ in 0..30 {
            let (id, r) = p.wait_done().unwrap();
            match r {
                Ok(v) => {
                    assert_eq!(u64::from(v), id * 2);
                    ok += 1;
                }
                Err(m) => {
                    assert!(m.contains("fails"), "{m}");
                    failed += 1;
                }
            }
        }
        assert_eq!((ok, failed), (20, 10));
        assert!(p.peak() >= 1);
    }

    #[test]
    fn a_full_queue_refuses_without_blocking() {
        let (gate_tx, gate_rx) = bounded::<()>(0);
        let gate_rx = Arc::new(parking_lot::Mutex::new(gate_rx));
        let p: Pool<u32, u32> = Pool::new(
            1,
            2,
            Arc::new(move |x: u32| {
                let _ = gate_rx.lock().recv();
                x
            }),
        )
        .unwrap();
        let mut refused = 0;
        for i in 0..10 {
            if p.try_submit(i, i as u32).unwrap().is_err() {
                refused += 1;
            }
        }
        // One job may be running, two queued: at least 7 refused.
        assert!(refused >= 7, "{refused}");
        drop(gate_tx);
        let accepted = 10 - refused;
        for _ in 0..accepted {
            let _ = p.wait_done().unwrap();
        }
    }
}
