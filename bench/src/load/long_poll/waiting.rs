//! Agents that wait: re-arming waiters (a long poll after each one that
//! returns), and a swarm of agents each in one long poll.

use std::time::Duration;

use futures_util::{StreamExt, stream};
use tokio::{task::JoinHandle, time::Instant};

use super::{OPEN_CONCURRENCY, holds_body, inbox_args, message_ids, poll_timeout, recover};
use crate::load::{Agent, MAX_CALLS_PER_WORKER, open_until};
use crate::mcp::{CallError, Conn, Target};
use crate::stats::Errors;

#[derive(Default, Debug)]
pub struct RearmOutcome {
    pub long_polls: u64,
    /// Long polls that waited their full time and returned nothing: with
    /// mail arriving every few milliseconds, each is a missed wake-up.
    pub empty_long_polls: u64,
    pub received_ids: Vec<String>,
    pub errors: Errors,
}

/// The body of the message that tells a re-arming waiter to stop.
pub const LAST_BODY: &str = "That was all for now: stop waiting.";

/// Agents that wait for mail in a loop: each long poll that returns is
/// followed at once by the next, until one returns a message with
/// `LAST_BODY`; then they drain their inboxes without waiting and end.
/// They wait on replica i+1 (the senders of `sends` use replica i). Send
/// the last message (with `deliver`) once every other send has been
/// answered: mail sent before it is then committed, and the drain takes it.
pub fn rearming(
    targets: &[Target],
    agents: &[Agent],
    wait_seconds: u64,
    hard_stop: Instant,
) -> Vec<JoinHandle<RearmOutcome>> {
    agents
        .iter()
        .enumerate()
        .map(|(i, me)| {
            let target = targets[(i + 1) % targets.len()].clone();
            let me = me.clone();
            tokio::spawn(async move {
                let mut out = RearmOutcome::default();
                let Some(mut conn) = open_until(&target, hard_stop, &mut out.errors).await else {
                    return out;
                };
                let timeout = poll_timeout(wait_seconds);
                conn.set_timeout(timeout);
                let mut told_to_stop = false;
                for _ in 0..MAX_CALLS_PER_WORKER {
                    if Instant::now() >= hard_stop {
                        break;
                    }
                    let wait = if told_to_stop { 0 } else { wait_seconds };
                    match conn
                        .call_tool("phone_inbox", inbox_args(wait), Some(&me.token))
                        .await
                    {
                        Ok(v) => {
                            let ids = message_ids(&v);
                            if told_to_stop && ids.is_empty() {
                                break;
                            }
                            if !told_to_stop {
                                out.long_polls += 1;
                                out.empty_long_polls += u64::from(ids.is_empty());
                            }
                            told_to_stop |= holds_body(&v, LAST_BODY);
                            out.received_ids.extend(ids);
                        }
                        Err(e) => {
                            out.errors.add("phone_inbox", e.kind(), &e.to_string());
                            if !recover(
                                &mut conn,
                                &e,
                                &target,
                                hard_stop,
                                Some(timeout),
                                &mut out.errors,
                            )
                            .await
                            {
                                break;
                            }
                        }
                    }
                }
                out
            })
        })
        .collect()
}

pub async fn join_rearming(
    tasks: Vec<JoinHandle<RearmOutcome>>,
    deadline: Instant,
) -> RearmOutcome {
    let mut total = RearmOutcome::default();
    for t in tasks {
        match tokio::time::timeout_at(deadline, t).await {
            Ok(Ok(o)) => {
                total.long_polls += o.long_polls;
                total.empty_long_polls += o.empty_long_polls;
                total.received_ids.extend(o.received_ids);
                total.errors.merge(o.errors);
            }
            Ok(Err(e)) => total.errors.add("waiter", "panic", &e.to_string()),
            Err(_) => total
                .errors
                .add("waiter", "did_not_end", "still polling at the deadline"),
        }
    }
    total
}

/// How one agent of the swarm fared.
#[derive(Debug)]
pub struct SwarmWaiter {
    pub received: Result<Vec<String>, CallError>,
    pub answered: Instant,
}

/// Many agents, each on its own keep-alive connection (replicas round
/// robin) with its own `initialize`, each in one long poll.
pub struct Swarm {
    /// (agent index, its long poll)
    tasks: Vec<(usize, JoinHandle<SwarmWaiter>)>,
    agents: usize,
    pub open_errors: Errors,
    /// When the last poll was due to go out.
    pub armed_by: Instant,
}

/// Opens a connection per agent (`OPEN_CONCURRENCY` at a time), then starts
/// their long polls one every `arm_every`, so that the polls' own
/// statements (poll, waiter row, poll) do not queue all at once for the
/// replicas' pools. Returns once every poll was scheduled.
pub async fn arm_swarm(
    targets: &[Target],
    agents: &[Agent],
    wait_seconds: u64,
    arm_every: Duration,
    deadline: Instant,
) -> Swarm {
    let mut open_errors = Errors::default();
    // Each open has its own timeout; `deadline` bounds them all (a stalled
    // replica would otherwise cost 10 s per 32 connections).
    let opened: Vec<(usize, Result<Conn, CallError>)> = stream::iter(0..agents.len())
        .map(|i| {
            let target = targets[i % targets.len()].clone();
            async move {
                let open = tokio::time::timeout_at(deadline, Conn::open(&target)).await;
                (
                    i,
                    open.unwrap_or(Err(CallError::Connect("not opened by the deadline".into()))),
                )
            }
        })
        .buffer_unordered(OPEN_CONCURRENCY)
        .collect()
        .await;
    let go = Instant::now() + Duration::from_millis(10);
    let mut tasks = Vec::new();
    for (i, conn) in opened {
        let mut conn = match conn {
            Ok(c) => c,
            Err(e) => {
                open_errors.add("initialize", e.kind(), &e.to_string());
                continue;
            }
        };
        conn.set_timeout(poll_timeout(wait_seconds));
        let me = agents[i].clone();
        let due = go + arm_every * i as u32;
        let task = tokio::spawn(async move {
            tokio::time::sleep_until(due.min(deadline)).await;
            let r = conn
                .call_tool("phone_inbox", inbox_args(wait_seconds), Some(&me.token))
                .await;
            SwarmWaiter {
                received: r.map(|v| message_ids(&v)),
                answered: Instant::now(),
            }
        });
        tasks.push((i, task));
    }
    Swarm {
        tasks,
        agents: agents.len(),
        open_errors,
        armed_by: go + arm_every * agents.len() as u32,
    }
}

impl Swarm {
    /// Every waiter's outcome, in agent order (`None`: never connected, or
    /// still waiting at `deadline`, then abandoned).
    pub async fn finish(self, deadline: Instant) -> Vec<Option<SwarmWaiter>> {
        let mut out: Vec<Option<SwarmWaiter>> = (0..self.agents).map(|_| None).collect();
        for (i, task) in self.tasks {
            let abort = task.abort_handle();
            match tokio::time::timeout_at(deadline, task).await {
                Ok(Ok(w)) => out[i] = Some(w),
                Ok(Err(_)) => {}
                Err(_) => abort.abort(),
            }
        }
        out
    }
}
