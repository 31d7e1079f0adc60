//! Group commit: concurrent sends and read-mode polls on one replica are
//! written by one statement and one commit (`mail`).
//!
//! Measured with pgbench on this machine, the send statement carrying 8
//! messages stores about 4 times as many messages per second as 8 separate
//! statements: per-statement work (executor start-up, commit, WAL flush,
//! waking a backend) dominates a one-row write. Batches form only under
//! load: a call that finds fewer than [`MAX_IN_FLIGHT`] batches running
//! starts one at once, so a lone call waits for nothing. Only calls in
//! flight live here, never state another replica would need; each caller
//! hears back after the commit, so a crash loses nothing acknowledged.

pub(crate) mod mail;
pub(crate) mod poll;
pub(crate) mod send;

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
};

use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::StoreError;

/// Locks a mutex even if a panic elsewhere poisoned it: the batcher's
/// bookkeeping is kept consistent by guards, not by unwinding.
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Batches that may run at once on a replica (unless stuck, see
/// [`STALLED_AFTER`]): the next batch forms while this one runs. Measured
/// (`make bench-quick`, A/B alternated twice): with 2, batches were half the
/// size for no gain in latency and 15-25% fewer sends/s, even at 16
/// connections where the cores were not saturated (bench/RESULTS.md).
const MAX_IN_FLIGHT: usize = 1;
/// At most this many calls per statement.
const MAX_BATCH: usize = 64;
/// A call still queued this long after it came, while no batch has started
/// meanwhile, starts one more: the running batch is stuck (on a row lock,
/// say), and the calls behind it need not be. Far above a batch's usual
/// few milliseconds, so it never fires under mere load.
const STALLED_AFTER: std::time::Duration = std::time::Duration::from_millis(100);

/// One statement that does the work of many calls.
pub(crate) trait Write: Send + Sync + 'static {
    type Item: Send + 'static;
    type Outcome: Send + 'static;

    /// One outcome per item, in order.
    fn write(
        &self,
        items: &[Self::Item],
    ) -> impl Future<Output = Result<Vec<Self::Outcome>, StoreError>> + Send;

    /// Whether work left by this writer's batches must still run in a
    /// statement of its own (wake-ups no later batch took along).
    fn has_follow_up(&self) -> bool {
        false
    }

    /// Runs that work when no batch came along to do it.
    fn follow_up(&self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// An outcome nobody could be handed (its caller went away while its
    /// statement ran): undo what can be undone (a read poll's messages go
    /// back to unread).
    fn abandoned(&self, _outcome: Self::Outcome) {}
}

/// Recipients of committed sends whose long polls are yet to be woken on
/// any replica. The check must run in a statement that begins after those
/// sends committed (see `send::wake_sql`): the next batch statement on this
/// replica takes them along; when none begins soon, the drain runs it alone.
#[derive(Default)]
pub(crate) struct PendingWakes(Mutex<Vec<i64>>);

impl PendingWakes {
    /// All pending recipients; the caller's statement now owns them.
    pub fn take(&self) -> Vec<i64> {
        std::mem::take(&mut *lock(&self.0))
    }

    /// Recipients whose statement failed (rolled back, nothing notified),
    /// or of sends just committed.
    pub fn add(&self, recipients: impl IntoIterator<Item = i64>) {
        lock(&self.0).extend(recipients);
    }

    pub fn is_empty(&self) -> bool {
        lock(&self.0).is_empty()
    }
}

/// How long a drain with follow-up work waits for another batch to take it
/// along before running it alone: a statement saved under steady load, at
/// most this much later for the work (the callers are answered already).
const LINGER: std::time::Duration = std::time::Duration::from_millis(2);

type Reply<W> = oneshot::Sender<Result<<W as Write>::Outcome, StoreError>>;

/// A queued call.
struct Queued<W: Write> {
    /// To find it again.
    number: u64,
    item: W::Item,
    reply: Reply<W>,
    /// Cancelled when the caller can no longer hear the answer: a call
    /// whose caller left before its batch began is dropped from it.
    gone: CancellationToken,
    /// The caller's request: a batch runs (is traced, logs) under the
    /// request of its first call, so every line it logs has a trace id.
    span: tracing::Span,
}

struct Queue<W: Write> {
    waiting: VecDeque<Queued<W>>,
    /// Numbers the queued calls.
    queued_total: u64,
    /// Counts the batches begun, to tell a stuck batch from a long queue.
    batches_started: u64,
    running: usize,
    /// Drains (among `running`) waiting briefly for a next batch.
    lingering: usize,
}

pub(crate) struct Batcher<W: Write> {
    writer: Arc<W>,
    queue: Arc<Mutex<Queue<W>>>,
    /// Wakes a lingering drain when a call queues.
    queued: Arc<tokio::sync::Notify>,
    /// How long a call may wait for its batch to start: as long as a call
    /// may wait for a pooled connection. Queued behind a batch stuck on a
    /// lock, it hears "busy, retry" in the same time as without batching
    /// (the chaos suite's lock test caught 2.98 s against 2.5 allowed).
    max_queue_wait: std::time::Duration,
    /// Batches that may run at once when some are stuck: a few, and never
    /// so many that other requests find the pool empty.
    max_in_flight_stalled: usize,
    /// The drains run here, so that shutdown can wait for the statements in
    /// flight (and what they leave to do) before the pool closes.
    tasks: tokio_util::task::TaskTracker,
}

impl<W: Write> Clone for Batcher<W> {
    fn clone(&self) -> Self {
        Self {
            writer: self.writer.clone(),
            queue: self.queue.clone(),
            queued: self.queued.clone(),
            max_queue_wait: self.max_queue_wait,
            max_in_flight_stalled: self.max_in_flight_stalled,
            tasks: self.tasks.clone(),
        }
    }
}

impl<W: Write> Batcher<W> {
    /// `max_queue_wait`: the pool timeout; `pool_size`: its connections;
    /// `tasks`: where the drains run.
    pub fn new(
        writer: W,
        max_queue_wait: std::time::Duration,
        pool_size: usize,
        tasks: tokio_util::task::TaskTracker,
    ) -> Self {
        Self {
            writer: Arc::new(writer),
            queue: Arc::new(Mutex::new(Queue {
                waiting: VecDeque::new(),
                queued_total: 0,
                batches_started: 0,
                running: 0,
                lingering: 0,
            })),
            queued: Arc::default(),
            max_queue_wait,
            max_in_flight_stalled: (pool_size / 2).clamp(1, 4),
            tasks,
        }
    }

    /// Does one call's work, alone or together with others in flight.
    /// `gone` is cancelled when the caller can no longer hear the answer:
    /// while the call is still queued it then leaves the queue, and a batch
    /// that begins after that leaves it out.
    pub async fn run(
        &self,
        item: W::Item,
        gone: CancellationToken,
    ) -> Result<W::Outcome, StoreError> {
        let (reply, mut outcome) = oneshot::channel();
        let (number, started_before, start) = {
            let mut queue = lock(&self.queue);
            queue.queued_total += 1;
            let number = queue.queued_total;
            queue.waiting.push_back(Queued {
                number,
                item,
                reply,
                gone: gone.clone(),
                span: tracing::Span::current(),
            });
            // A lingering drain takes it at once; otherwise start one if allowed.
            let start = queue.lingering == 0 && queue.running < MAX_IN_FLIGHT;
            if start {
                queue.running += 1;
            }
            (number, queue.batches_started, start)
        };
        let queued_at = tokio::time::Instant::now();
        if start {
            // A task of its own, so a caller that goes away (a closed
            // connection drops its request) cannot abandon the others' work
            // halfway.
            self.tasks.spawn(self.clone().drain());
        } else {
            self.queued.notify_one();
            let stalled_after = STALLED_AFTER.min(self.max_queue_wait);
            tokio::select! {
                done = &mut outcome => return done.unwrap_or(Err(StoreError::BatchLost)),
                _ = gone.cancelled() => return self.leave(number, &mut outcome, StoreError::CallerGone).await,
                _ = tokio::time::sleep(stalled_after) => {}
            }
            let unstick = {
                let mut queue = lock(&self.queue);
                let stuck = queue.batches_started == started_before
                    && queue.running < self.max_in_flight_stalled
                    && queue.waiting.iter().any(|q| q.number == number);
                if stuck {
                    queue.running += 1;
                }
                stuck
            };
            if unstick {
                self.tasks.spawn(self.clone().drain());
            }
        }
        let left_to_wait = self.max_queue_wait.saturating_sub(queued_at.elapsed());
        tokio::select! {
            done = &mut outcome => done.unwrap_or(Err(StoreError::BatchLost)),
            _ = gone.cancelled() => self.leave(number, &mut outcome, StoreError::CallerGone).await,
            _ = tokio::time::sleep(left_to_wait) => {
                let busy = StoreError::Unavailable(super::POOL_BUSY.into());
                self.leave(number, &mut outcome, busy).await
            }
        }
    }

    /// Leaves the queue with `why` if the call is still queued (nothing was
    /// done); a call already taken into a batch waits for what its statement
    /// did.
    async fn leave(
        &self,
        number: u64,
        outcome: &mut oneshot::Receiver<Result<W::Outcome, StoreError>>,
        why: StoreError,
    ) -> Result<W::Outcome, StoreError> {
        let left = {
            let mut queue = lock(&self.queue);
            let before = queue.waiting.len();
            queue.waiting.retain(|q| q.number != number);
            queue.waiting.len() < before
        };
        if left {
            return Err(why);
        }
        outcome.await.unwrap_or(Err(StoreError::BatchLost))
    }

    /// Writes batches until nobody waits.
    async fn drain(self) {
        // Gives the drain's place back however it ends: a panic in a write
        // or an aborted task must not leave the queue believing a batch
        // still runs (every later call would wait out the stall delay, and
        // with a small pool hear "busy").
        let mut running = Running {
            batcher: self.clone(),
            lingering: false,
            released: false,
        };
        // The request the last batch ran under: its follow-up runs there too
        // (that request's trace then ends up to a linger and one statement
        // later than its answer; its logged lines keep their trace id).
        let mut last_span = tracing::Span::none();
        let mut lingered = false;
        loop {
            let (batch, linger) = {
                let mut queue = lock(&self.queue);
                let batch = take_batch::<W>(&mut queue.waiting);
                if !batch.is_empty() {
                    queue.batches_started += 1;
                }
                let linger = batch.is_empty() && !lingered && self.writer.has_follow_up();
                if linger {
                    queue.lingering += 1;
                    running.lingering = true;
                } else if batch.is_empty() {
                    queue.running -= 1;
                    running.released = true;
                }
                (batch, linger)
            };
            if batch.is_empty() {
                if linger {
                    // Under steady load the next batch (of either kind)
                    // comes within this and takes the work along.
                    lingered = true;
                    let _ = tokio::time::timeout(LINGER, self.queued.notified()).await;
                    lock(&self.queue).lingering -= 1;
                    running.lingering = false;
                    continue;
                }
                // Callers are answered; this only follows up their commits.
                if self.writer.has_follow_up() {
                    self.writer.follow_up().instrument(last_span).await;
                }
                return;
            }
            lingered = false;
            last_span = batch[0].span.clone();
            self.write(batch).instrument(last_span.clone()).await;
        }
    }

    async fn write(&self, batch: Vec<Queued<W>>) {
        let mut items = Vec::with_capacity(batch.len());
        let mut callers = Vec::with_capacity(batch.len());
        for q in batch {
            items.push(q.item);
            callers.push((q.reply, q.gone));
        }
        match self.writer.write(&items).await {
            Ok(outcomes) => {
                for ((reply, gone), outcome) in callers.into_iter().zip(outcomes) {
                    self.hand_over(reply, &gone, Ok(outcome));
                }
            }
            // One call the database refuses must not fail the others: run
            // them one by one, so only its own caller gets the error.
            Err(e) if items.len() > 1 && !e.is_unavailable() => {
                tracing::warn!(error = %e, size = items.len(), "batch refused; running its calls one by one");
                for (item, (reply, gone)) in items.into_iter().zip(callers) {
                    let outcome = self
                        .writer
                        .write(std::slice::from_ref(&item))
                        .await
                        .and_then(|mut one| one.pop().ok_or(StoreError::BatchLost));
                    self.hand_over(reply, &gone, outcome);
                }
            }
            Err(e) if callers.len() == 1 => {
                if let Some((reply, _)) = callers.into_iter().next() {
                    let _ = reply.send(Err(e));
                }
            }
            // Unavailable: every call hears why.
            Err(e) => {
                tracing::warn!(error = %e, size = items.len(), "batch failed");
                let reason = e.unavailable_reason();
                for (reply, _) in callers {
                    let _ = reply.send(Err(StoreError::Unavailable(reason.clone())));
                }
            }
        }
    }

    /// Hands a call's outcome to its caller. When the caller left while the
    /// statement ran (it disconnected, or its request was dropped), nobody
    /// will read the outcome: what can be undone is undone here, in the
    /// drain, so that shutdown (which waits for the drains) also waits for
    /// it.
    fn hand_over(
        &self,
        reply: Reply<W>,
        gone: &CancellationToken,
        outcome: Result<W::Outcome, StoreError>,
    ) {
        let outcome = match outcome {
            Ok(outcome) if gone.is_cancelled() => {
                self.writer.abandoned(outcome);
                Err(StoreError::CallerGone)
            }
            other => other,
        };
        if let Err(Ok(outcome)) = reply.send(outcome) {
            self.writer.abandoned(outcome);
        }
    }
}

/// A drain's place among the running ones, given back when the drain ends,
/// also by a panic or an abort (then a drain is started for whoever still
/// waits).
struct Running<W: Write> {
    batcher: Batcher<W>,
    /// Counted among the lingering drains right now.
    lingering: bool,
    /// Given back already, by the drain itself.
    released: bool,
}

impl<W: Write> Drop for Running<W> {
    fn drop(&mut self) {
        if self.released {
            return;
        }
        tracing::error!("a group-commit drain ended abnormally; its place is given back");
        let restart = {
            let mut queue = lock(&self.batcher.queue);
            queue.running -= 1;
            if self.lingering {
                queue.lingering -= 1;
            }
            let restart = !queue.waiting.is_empty() && queue.running < MAX_IN_FLIGHT;
            if restart {
                queue.running += 1;
            }
            restart
        };
        if restart && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            self.batcher
                .tasks
                .spawn_on(self.batcher.clone().drain(), &runtime);
        } else if restart {
            lock(&self.batcher.queue).running -= 1;
        }
    }
}

/// Up to [`MAX_BATCH`] calls from the front of the queue, in order; a call
/// whose caller has gone is answered and left out.
fn take_batch<W: Write>(waiting: &mut VecDeque<Queued<W>>) -> Vec<Queued<W>> {
    let mut batch = Vec::with_capacity(waiting.len().min(MAX_BATCH));
    while batch.len() < MAX_BATCH {
        let Some(entry) = waiting.pop_front() else {
            break;
        };
        // Its caller left before the statement began: nothing is done.
        if entry.gone.is_cancelled() {
            let _ = entry.reply.send(Err(StoreError::CallerGone));
            continue;
        }
        batch.push(entry);
    }
    batch
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    /// Echoes its items; its first `panics` writes panic instead.
    struct Flaky {
        panics: AtomicUsize,
    }

    impl Write for Flaky {
        type Item = u32;
        type Outcome = u32;

        async fn write(&self, items: &[u32]) -> Result<Vec<u32>, StoreError> {
            let left = self.panics.load(Ordering::SeqCst);
            if left > 0 {
                self.panics.store(left - 1, Ordering::SeqCst);
                panic!("a write that panics (this test's own)");
            }
            Ok(items.to_vec())
        }
    }

    /// With a pool of two, one batch runs at a time even when stuck: a drain
    /// that panicked and kept its place would leave every later call
    /// waiting out the queue timeout ("busy").
    #[tokio::test]
    async fn a_drain_that_panics_gives_its_place_back() {
        let batcher = Batcher::new(
            Flaky {
                panics: AtomicUsize::new(1),
            },
            Duration::from_secs(2),
            2,
            tokio_util::task::TaskTracker::new(),
        );
        let first = batcher.run(1, CancellationToken::new()).await;
        assert!(matches!(first, Err(StoreError::BatchLost)), "{first:?}");
        let second = batcher.run(2, CancellationToken::new()).await;
        assert_eq!(second.unwrap(), 2);
        assert_eq!(
            lock(&batcher.queue).running,
            0,
            "the drains' places are all back"
        );
    }

    /// A call whose caller left while it was queued is answered at once and
    /// never written.
    #[tokio::test]
    async fn a_call_whose_caller_left_is_never_written() {
        let gone = CancellationToken::new();
        gone.cancel();
        let mut queue = VecDeque::new();
        let (reply, answer) = oneshot::channel();
        queue.push_back(Queued::<Flaky> {
            number: 1,
            item: 7,
            reply,
            gone,
            span: tracing::Span::none(),
        });
        assert!(take_batch::<Flaky>(&mut queue).is_empty());
        assert!(matches!(answer.await, Ok(Err(StoreError::CallerGone))));
    }
}
