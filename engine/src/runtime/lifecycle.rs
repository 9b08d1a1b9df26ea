//! How a running [`Engine`] ends: asked to stop, waited for, or dropped. Its workers end
//! first, then its coordinator (uploads in flight finish), then its hold on the node.

use std::sync::atomic::Ordering;

use super::{Engine, EngineError};

impl Engine {
    /// Asks every task to stop.
    pub fn stop(&self) {
        self.shared.stop.store(true, Ordering::Release);
        for u in &self.shared.unparkers {
            u.unpark();
        }
    }

    /// Waits until every local task has finished (or the engine was stopped), then shuts the
    /// router and transport down.
    pub fn wait(mut self) -> Result<(), EngineError> {
        let mut first_err = None;
        for (worker, w) in self.workers.drain(..).enumerate() {
            match w.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.shared.fail(e.to_string());
                    first_err.get_or_insert(EngineError::Task(e));
                }
                Err(_) => {
                    self.shared.fail(format!("worker {worker} panicked"));
                    first_err.get_or_insert(EngineError::WorkerPanicked { worker });
                }
            }
        }
        if let Some(c) = self.coordinator.take() {
            // The workers are gone, so the job queue is closed: uploads in flight finish.
            c.stop();
        }
        if let Some(n) = self.node.as_mut() {
            n.release();
        }
        drop(self.log_floors.take());
        if let Some(e) = first_err {
            return Err(e);
        }
        match self.shared.failure.get() {
            Some(why) => Err(EngineError::Failed(why.clone())),
            None => Ok(()),
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        if let Some(c) = self.coordinator.take() {
            c.stop();
        }
        if let Some(n) = self.node.as_mut() {
            n.release();
        }
    }
}
