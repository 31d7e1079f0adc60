//! Sending: to one agent, to several at once (one message per recipient,
//! one thread), replies to one party or to everyone ("reply all"), and
//! mail that expires.

use chrono::{DateTime, Utc};

use super::types::{self, AgentName, IdempotencyKey, InvalidInput, MessageId};
use super::{Call, Credentials, Phone, PhoneError};
use crate::store::{self, Addressee, QueuedSend, copy_key, other_copy_key};

/// Recipients of one send, at most this many.
pub const RECIPIENTS_MAX: usize = 20;
/// The statement's refusal by the recipient's policy, a block or a
/// suspension (the others are capacity: quotas, shares, a full inbox).
const POLICY_REFUSAL: &str = "refused";
/// The longest lifetime a message may be given: 30 days.
pub const EXPIRES_IN_MAX: u32 = 30 * 24 * 3600;
/// What `to` says for "everyone in the conversation" (with `reply_to`):
/// not a name, which has no `*`.
pub const EVERYONE: &str = "*";

/// Who a send goes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipients {
    /// `to` omitted: only with `reply_to`, the other party of the message.
    OtherParty,
    /// One name or several (a group send).
    Names(Vec<AgentName>),
    /// `to: "*"` with `reply_to`: everyone the message went between.
    Everyone,
}

#[derive(Debug, Clone)]
pub struct SendRequest {
    pub to: Recipients,
    pub subject: Option<String>,
    pub body: String,
    pub reply_to: Option<MessageId>,
    pub idempotency_key: Option<IdempotencyKey>,
    /// Seconds until the message is no longer delivered.
    pub expires_in: Option<u32>,
}

impl SendRequest {
    /// A send to one agent (or a reply), as the console writes it.
    pub fn parse(
        to: Option<&str>,
        body: &str,
        subject: Option<&str>,
        reply_to: Option<&str>,
        idempotency_key: Option<&str>,
    ) -> Result<Self, InvalidInput> {
        let to: Vec<&str> = to.into_iter().collect();
        Self::parse_to(&to, body, subject, reply_to, idempotency_key, None)
    }

    /// `to`: no names (a reply's other party), one or several names, or
    /// `*` alone (with `reply_to`: everyone).
    pub fn parse_to(
        to: &[&str],
        body: &str,
        subject: Option<&str>,
        reply_to: Option<&str>,
        idempotency_key: Option<&str>,
        expires_in: Option<u32>,
    ) -> Result<Self, InvalidInput> {
        let reply_to = reply_to
            .map(|r| MessageId::parse("reply_to", r))
            .transpose()?;
        let to = parse_recipients(to, reply_to.is_some())?;
        if let Some(secs) = expires_in
            && !(1..=EXPIRES_IN_MAX).contains(&secs)
        {
            return Err(InvalidInput::new(
                "expires_in",
                format!("must be from 1 to {EXPIRES_IN_MAX} seconds; got {secs}"),
            ));
        }
        Ok(Self {
            to,
            subject: subject
                .filter(|s| !s.trim().is_empty())
                .map(|s| types::single_line("subject", s, types::SUBJECT_MAX))
                .transpose()?,
            body: types::body(body)?,
            reply_to,
            idempotency_key: idempotency_key.map(IdempotencyKey::parse).transpose()?,
            expires_in,
        })
    }
}

/// Whether what an earlier send stored under the key is this copy of this
/// send (a retry), not another send that used the key.
fn is_same_send(
    earlier: &store::messages::Earlier,
    target: &Target,
    req: &SendRequest,
    reply_to: Option<i64>,
) -> bool {
    earlier.recipient == target.name.as_str()
        && earlier.subject == req.subject
        && earlier.body == req.body
        && earlier.reply_to == reply_to
}

fn parse_recipients(to: &[&str], replying: bool) -> Result<Recipients, InvalidInput> {
    if to.iter().any(|t| t.trim() == EVERYONE) {
        if to.len() > 1 {
            return Err(InvalidInput::new(
                "to",
                "\"*\" stands alone: it means everyone in the conversation of reply_to",
            ));
        }
        if !replying {
            return Err(InvalidInput::new(
                "to",
                "\"*\" (everyone in a conversation) needs reply_to, the message you answer; \
                 otherwise list the names",
            ));
        }
        return Ok(Recipients::Everyone);
    }
    if to.is_empty() {
        if replying {
            return Ok(Recipients::OtherParty);
        }
        return Err(InvalidInput::new(
            "to",
            "is required (the recipient's name, or a list of names) unless reply_to names a message to answer",
        ));
    }
    if to.len() > RECIPIENTS_MAX {
        return Err(InvalidInput::new(
            "to",
            format!(
                "lists {} names; send to at most {RECIPIENTS_MAX} at once",
                to.len()
            ),
        ));
    }
    let mut names: Vec<AgentName> = Vec::with_capacity(to.len());
    for raw in to {
        let name = AgentName::parse("to", raw)?;
        if names.contains(&name) {
            return Err(InvalidInput::new(
                "to",
                format!("names '{name}' twice; list each recipient once"),
            ));
        }
        names.push(name);
    }
    Ok(Recipients::Names(names))
}

/// What a send did.
#[derive(Debug, Clone)]
pub struct Sent {
    /// The message, or for a group send the first copy stored.
    pub id: MessageId,
    /// The recipient, or for a group send the names, comma-separated.
    pub to: String,
    pub thread_id: MessageId,
    pub sent_at: DateTime<Utc>,
    /// True when this idempotency_key was seen before: nothing new was sent.
    pub replayed: bool,
    /// A send to several: each recipient's outcome, in order (empty for a
    /// send to one, whose failure is the call's error).
    pub copies: Vec<CopySent>,
}

/// One recipient's outcome in a group send.
#[derive(Debug, Clone)]
pub struct CopySent {
    pub to: AgentName,
    /// Stored (now, or by the earlier send with the same key).
    pub id: Option<MessageId>,
    /// Why it was not: the words the error of a send to it alone would
    /// have (a block reads like a policy, so it is not revealed).
    pub error: Option<String>,
}

/// A copy's refusal with its recipient's name taken out: copies refused
/// for the same reason have the same one (a block reads like a policy, so
/// grouping by it reveals nothing a single answer would not).
pub fn refusal_reason(error: &str, to: &str) -> String {
    error.replace(&format!("'{to}'"), "'\u{0}'")
}

/// The refusals of a group send that stored nothing, each reason said once:
/// in full for the first recipient it stopped, then "(the same for 'b',
/// 'c')"; a reason that names no recipient (a quota) ends with "(for 'a',
/// 'b')". Twenty recipients whose inboxes are full are one sentence, not
/// twenty copies of it.
fn refusals_once(copies: &[CopySent]) -> String {
    let mut reasons: Vec<(String, &CopySent, Vec<&str>)> = Vec::new();
    for copy in copies {
        let Some(reason) = copy
            .error
            .as_deref()
            .map(|e| refusal_reason(e, copy.to.as_str()))
        else {
            continue;
        };
        match reasons.iter_mut().find(|(r, _, _)| *r == reason) {
            Some((_, _, others)) => others.push(copy.to.as_str()),
            None => reasons.push((reason, copy, Vec::new())),
        }
    }
    let quoted = |names: &[&str]| {
        names
            .iter()
            .map(|n| format!("'{n}'"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    reasons
        .iter()
        .map(|(_, first, others)| {
            let error = first.error.as_deref().unwrap_or_default();
            // A reason that names no one (a quota) names all it stopped.
            if !error.contains(&format!("'{}'", first.to)) {
                let mut all = vec![first.to.as_str()];
                all.extend(others);
                return format!("{error} (for {})", quoted(&all));
            }
            if others.is_empty() {
                error.to_owned()
            } else {
                format!("{error} (the same for {})", quoted(others))
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One addressee as resolved for the store, with its name for the answer.
struct Target {
    name: AgentName,
    addressee: Addressee,
}

impl Phone {
    pub async fn send(
        &self,
        creds: &Credentials,
        req: SendRequest,
        call: &Call,
    ) -> Result<Sent, PhoneError> {
        let claimed = creds.claimed_name();
        let (targets, thread_id) = self.targets(creds, &req).await?;
        let group = targets.len() > 1;
        let key = req.idempotency_key.as_ref().map(IdempotencyKey::as_str);
        let reply_to = req.reply_to.map(|m| m.0);
        // One statement verifies the caller, resolves each recipient and
        // inserts a copy for each, together with the other sends in flight
        // on this replica. A conflicting idempotency key inserts nothing
        // (after waiting for a concurrent insert of the same key to commit).
        let outcome = self
            .store
            .send(
                QueuedSend {
                    token: creds.token.0,
                    claimed: claimed.map(str::to_owned),
                    to: targets.iter().map(|t| t.addressee.clone()).collect(),
                    subject: req.subject.clone(),
                    body: req.body.clone(),
                    reply_to,
                    thread_id,
                    idempotency_key: key.map(str::to_owned),
                    expires_in: req.expires_in.map(f64::from),
                },
                call.gone.clone(),
            )
            .await
            .map_err(|e| resend_hint(e.into(), key))?;
        let Some(me_id) = outcome.me_id else {
            return Err(self.authentication_error(creds).await);
        };
        // Copies not stored under a key may be an earlier send's: a replay.
        let earlier = match key {
            Some(key) => {
                self.earlier_tries(me_id, key, &targets, &outcome, &req, reply_to)
                    .await?
            }
            None => vec![None; targets.len()],
        };
        // A refused copy's replay of a group send's copy is only reported:
        // it may be a concurrent try's copy (stored after this statement's
        // snapshot), whose group that try mends itself; joining it here
        // raced that repair. A send to one has no group to mend: the
        // copies stored now join it (a retry that grew the send).
        let earlier_stored: Vec<Option<store::messages::Earlier>> = earlier
            .iter()
            .zip(&outcome.copies)
            .map(|(e, copy)| {
                e.clone()
                    .filter(|e| copy.refusal.is_none() || e.group_id.is_none())
            })
            .collect();
        let joined = match self
            .join_earlier_group(me_id, &req, reply_to, &targets, &outcome, &earlier_stored)
            .await?
        {
            None if group => {
                // Copies whose keys an earlier send of another text holds.
                let lost = earlier_stored.iter().zip(&targets).any(|(e, t)| {
                    e.as_ref()
                        .is_some_and(|e| !is_same_send(e, t, &req, reply_to))
                });
                self.name_by_a_stored_copy(me_id, thread_id, lost, &outcome)
                    .await?
            }
            joined => joined,
        };
        // Where an earlier try's copies were found or a repair ran, each
        // copy's thread as it is now: a repair may have moved them, or
        // mended a thread named after a copy a racing try kept out.
        let threads = if joined.is_some() || earlier.iter().any(Option::is_some) {
            let ids: Vec<i64> = outcome
                .copies
                .iter()
                .zip(&earlier)
                .filter_map(|(c, e)| c.stored.as_ref().map(|s| s.id).or(e.as_ref().map(|e| e.id)))
                .collect();
            let db = self.store.db().await?;
            store::messages::threads_of(&db, &ids).await?
        } else {
            Default::default()
        };
        let thread_now = |id: i64, planned: i64| threads.get(&id).copied().unwrap_or(planned);
        let mut first: Option<(MessageId, MessageId, DateTime<Utc>)> = None;
        let mut all_replayed = true;
        let mut errors = Vec::new();
        let mut copies = Vec::with_capacity(targets.len());
        for ((target, copy), earlier) in targets.iter().zip(&outcome.copies).zip(earlier) {
            let result = match (&copy.stored, earlier) {
                (Some(stored), _) => {
                    all_replayed = false;
                    Ok((
                        stored.id,
                        thread_now(stored.id, joined.unwrap_or(stored.thread_id)),
                        stored.sent_at,
                    ))
                }
                (None, Some(e)) => {
                    if is_same_send(&e, target, &req, reply_to) {
                        Ok((e.id, thread_now(e.id, e.thread_id), e.sent_at))
                    } else {
                        Err(PhoneError::IdempotencyConflict(
                            key.unwrap_or_default().to_owned(),
                        ))
                    }
                }
                // A party of a reply (by id) that is gone left the
                // directory: its name may be someone else's by now, who
                // search finds ("no agent named" sent the caller there).
                (None, None) if copy.refusal.is_none() && target.addressee.id.is_some() => {
                    Err(PhoneError::PartyLeft(target.name.clone()))
                }
                (None, None) => Err(refusal(copy.refusal.as_deref(), &target.name)),
            };
            match result {
                Ok((id, thread, at)) => {
                    first.get_or_insert((MessageId(id), MessageId(thread), at));
                    copies.push(CopySent {
                        to: target.name.clone(),
                        id: Some(MessageId(id)),
                        error: None,
                    });
                }
                Err(e) => {
                    copies.push(CopySent {
                        to: target.name.clone(),
                        id: None,
                        error: Some(e.to_string()),
                    });
                    errors.push(e);
                }
            }
        }
        let Some((id, thread_id, sent_at)) = first else {
            // Nothing stored: a send to one fails with its own error.
            if !group && let Some(e) = errors.pop() {
                return Err(e);
            }
            return Err(PhoneError::NothingSent(refusals_once(&copies)));
        };
        Ok(Sent {
            id,
            to: targets
                .iter()
                .map(|t| t.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            thread_id,
            sent_at,
            replayed: all_replayed,
            copies: if group { copies } else { Vec::new() },
        })
    }

    /// For each copy this try did not store, what an earlier try with its
    /// key stored, if that is this send.
    ///
    /// Refused copies too: a retry of a send the key already stored replays
    /// it whatever would refuse a new send now (the recipient closed to the
    /// sender since, or the sender's share of the inbox is full with that
    /// very message). A caller whose answer was lost must hear "sent", or it
    /// sends again unkeyed.
    ///
    /// A copy refused for a full quota, share or inbox may have a try in
    /// flight that its statement's snapshot could not show, which passed
    /// where this one was refused (another send filled the quota between
    /// the two). One such copy is probed first: the probe waits for that
    /// try to commit (it stores all its copies in one statement), so the
    /// look-up then finds them. One row, so that probes hold nothing while
    /// they wait (refused group sends with one key in different orders
    /// deadlocked each other's probes: a reviewer's attack) and a flood of
    /// refusals writes one probe per call; none for a policy's refusal,
    /// which a try begun an instant earlier meets too.
    async fn earlier_tries(
        &self,
        me_id: i64,
        key: &str,
        targets: &[Target],
        outcome: &store::SendOutcome,
        req: &SendRequest,
        reply_to: Option<i64>,
    ) -> Result<Vec<Option<store::messages::Earlier>>, PhoneError> {
        let mut earlier = vec![None; targets.len()];
        let unstored: Vec<usize> = (0..targets.len())
            .filter(|&i| outcome.copies[i].stored.is_none())
            .collect();
        if unstored.is_empty() {
            return Ok(earlier);
        }
        let key_of = |i: usize| {
            let to = targets[i].name.as_str();
            store::messages::CopyKey {
                key: copy_key(key, to, targets.len()),
                other: other_copy_key(key, to, targets.len()),
                recipient: to,
            }
        };
        let db = self.store.db().await?;
        let at_capacity = unstored.iter().copied().find(|&i| {
            outcome.copies[i]
                .refusal
                .as_deref()
                .is_some_and(|r| r != POLICY_REFUSAL)
        });
        if let Some(i) = at_capacity {
            store::messages::wait_for_a_copy_in_flight(&db, me_id, &key_of(i))
                .await
                .map_err(|e| resend_hint(e.into(), Some(key)))?;
        }
        let keys: Vec<_> = unstored.iter().map(|&i| key_of(i)).collect();
        let found = store::messages::by_idempotency_keys(&db, me_id, &keys).await?;
        for (i, found) in unstored.into_iter().zip(found) {
            // A refused copy stays refused unless it is a replay.
            earlier[i] = found.filter(|e| {
                outcome.copies[i].refusal.is_none() || is_same_send(e, &targets[i], req, reply_to)
            });
        }
        Ok(earlier)
    }

    /// A group send whose copies are partly new and partly an earlier
    /// try's (the same send, retried): the new copies join the earlier
    /// copies' thread and group, which a retry racing that try on another
    /// replica could not see. A replay with nothing new mends the earlier
    /// group instead, in case a repair after that try never ran. The
    /// thread they are in then, if changed.
    async fn join_earlier_group(
        &self,
        me_id: i64,
        req: &SendRequest,
        reply_to: Option<i64>,
        targets: &[Target],
        outcome: &store::SendOutcome,
        earlier: &[Option<store::messages::Earlier>],
    ) -> Result<Option<i64>, PhoneError> {
        // The lowest of the earlier copies' groups, as the insert chooses
        // (tries racing each other can leave more than one).
        let same_send = earlier
            .iter()
            .zip(targets)
            .filter_map(|(e, t)| e.as_ref().filter(|e| is_same_send(e, t, req, reply_to)))
            .min_by_key(|e| (e.group_id.is_none(), e.group_id, e.id));
        let Some(earlier) = same_send else {
            return Ok(None);
        };
        let fresh: Vec<i64> = outcome
            .copies
            .iter()
            .filter_map(|c| c.stored.as_ref().map(|s| s.id))
            .collect();
        let Some(group_id) = earlier.group_id else {
            // A try that went to this copy's recipient alone: its copy and
            // the ones stored now become one group, named after it (the
            // lowest), so each recipient sees the others in `also_to` and
            // search holds the text once; `heal_groups` also mends a group
            // the statement named after a copy that a racing send's key
            // kept out.
            if fresh.is_empty() {
                return Ok(None);
            }
            let mut ids = fresh;
            ids.push(earlier.id);
            let joined = self
                .repair_group(me_id, ids, (earlier.thread_id, earlier.id), RECIPIENTS_MAX)
                .await?;
            return Ok(joined.then_some(earlier.thread_id));
        };
        if fresh.is_empty() {
            self.repair_group(me_id, Vec::new(), (earlier.thread_id, group_id), usize::MAX)
                .await?;
            return Ok(None);
        }
        // A message reaches at most RECIPIENTS_MAX: retries that each add
        // recipients grew one group to hundreds (an outsider's attack),
        // and a reply to everyone on it then reached them all. Past the
        // limit, the copies stored now are a message of their own; joined
        // or not, they are in the earlier copies' thread (the statement
        // put them there).
        self.repair_group(me_id, fresh, (earlier.thread_id, group_id), RECIPIENTS_MAX)
            .await?;
        Ok(Some(earlier.thread_id))
    }

    /// Puts `ids` into `thread` and `group` and mends the group
    /// (`join_group`; with no ids, `heal_groups` alone), to the end even if
    /// the caller goes away meanwhile: the copies are committed, and a
    /// group left half-repaired keeps them from search. Not when the group
    /// would then hold more than `members_max` copies (false).
    async fn repair_group(
        &self,
        me_id: i64,
        ids: Vec<i64>,
        (thread, group): (i64, i64),
        members_max: usize,
    ) -> Result<bool, PhoneError> {
        let store = self.store.clone();
        let repair = self.store.run_detached(async move {
            // Unguarded: the copies are committed (and confirmed) already,
            // so "nothing was done" would be wrong; a group left half-mended
            // by a failover is mended by a retry of the send.
            let db = store.db().await?.unguarded();
            let done =
                store::messages::join_group(&db, me_id, &ids, thread, group, members_max).await;
            if let Err(e) = &done {
                // Heard by the caller if it is still there; logged in
                // case it is not. A retry of the send mends the group.
                tracing::warn!(error = %e, group, "could not mend a group send's group");
            }
            done
        });
        match repair.await {
            Some(done) => Ok(done?),
            None => Err(PhoneError::Internal),
        }
    }

    /// A group send that raced another send using its key for another text
    /// (through another replica, or in the same batch) cannot see that
    /// send's copies, and may have named its group (and, unless it is a
    /// reply, its thread) after a copy of its own that then conflicted and
    /// was never stored: a thread no `phone_thread` finds, and a group whose
    /// text search cannot find (only a group's first copy is indexed). They
    /// move to its lowest stored copy (a reply stays in its thread,
    /// `reply_thread`). The thread they are in then, if changed.
    ///
    /// A send some of whose copies lost their keys to another send's
    /// (`lost`) has them on its first copy's list of recipients: the group
    /// is mended (`heal_groups`), so that search does not take them for
    /// recipients.
    async fn name_by_a_stored_copy(
        &self,
        me_id: i64,
        reply_thread: Option<i64>,
        lost: bool,
        outcome: &store::SendOutcome,
    ) -> Result<Option<i64>, PhoneError> {
        let stored: Vec<&store::Stored> = outcome
            .copies
            .iter()
            .filter_map(|c| c.stored.as_ref())
            .collect();
        let Some(first) = stored.iter().map(|s| s.id).min() else {
            return Ok(None);
        };
        let named_by_a_stored_copy =
            |id: Option<i64>| id.is_none_or(|id| stored.iter().any(|t| t.id == id));
        if stored.iter().all(|s| {
            named_by_a_stored_copy(s.group_id)
                && (reply_thread.is_some() || named_by_a_stored_copy(Some(s.thread_id)))
        }) {
            if let Some(group) = stored.iter().find_map(|s| s.group_id)
                && lost
            {
                self.repair_group(me_id, Vec::new(), (first, group), usize::MAX)
                    .await?;
            }
            return Ok(None);
        }
        let thread = reply_thread.unwrap_or(first);
        let ids: Vec<i64> = stored.iter().map(|s| s.id).collect();
        self.repair_group(me_id, ids, (thread, first), usize::MAX)
            .await?;
        Ok(Some(thread))
    }

    /// Who the send goes to and, for a reply, the thread it joins. A reply
    /// goes to parties of the original by id (a name released and
    /// re-registered since cannot receive it).
    async fn targets(
        &self,
        creds: &Credentials,
        req: &SendRequest,
    ) -> Result<(Vec<Target>, Option<i64>), PhoneError> {
        let Some(original) = req.reply_to else {
            let Recipients::Names(names) = &req.to else {
                return Err(PhoneError::Internal);
            };
            let targets = names
                .iter()
                .map(|name| Target {
                    name: name.clone(),
                    addressee: Addressee {
                        name: name.as_str().to_owned(),
                        id: None,
                        answers_recipient: false,
                    },
                })
                .collect();
            return Ok((targets, None));
        };
        let db = self.store.db().await?;
        let target = store::messages::reply_target(
            &db,
            creds.token.as_bytes(),
            creds.claimed_name(),
            original.0,
        )
        .await?;
        drop(db);
        let Some(target) = target else {
            return Err(self.authentication_error(creds).await);
        };
        let target = target.ok_or(PhoneError::UnknownMessage(original))?;
        let me = target.me_id;
        // The other party: the sender, or for one's own message its recipient.
        let other = if target.sender_id == me {
            target.recipient_id
        } else {
            target.sender_id
        };
        let mut parties: Vec<(i64, AgentName)> = Vec::new();
        for (id, name) in &target.parties {
            let name = AgentName::parse("to", name).map_err(|_| PhoneError::Internal)?;
            // Oneself only when one wrote to oneself.
            if *id != me || other == me {
                parties.push((*id, name));
            }
        }
        let chosen: Vec<(i64, AgentName)> = match &req.to {
            Recipients::OtherParty => parties.into_iter().filter(|(id, _)| *id == other).collect(),
            Recipients::Everyone => {
                // A message reaches at most RECIPIENTS_MAX; one found with
                // more (a retry's copies joined it an instant before their
                // repair moves them out) is answered by name, not by all.
                if parties.len() > RECIPIENTS_MAX {
                    return Err(InvalidInput::new(
                        "to",
                        format!(
                            "\"*\" would answer {} parties; a send goes to at most {RECIPIENTS_MAX}: name the ones to answer",
                            parties.len()
                        ),
                    )
                    .into());
                }
                parties
            }
            Recipients::Names(names) => {
                let mut chosen = Vec::new();
                for name in names {
                    match parties.iter().find(|(_, n)| n == name) {
                        Some(party) => chosen.push(party.clone()),
                        None => {
                            return Err(PhoneError::ReplyToOtherParty {
                                reply_to: original,
                                other: parties
                                    .iter()
                                    .map(|(_, n)| n.as_str())
                                    .collect::<Vec<_>>()
                                    .join("', '"),
                            });
                        }
                    }
                }
                chosen
            }
        };
        if chosen.is_empty() {
            return Err(PhoneError::Internal);
        }
        let targets = chosen
            .into_iter()
            .map(|(id, name)| Target {
                addressee: Addressee {
                    name: name.as_str().to_owned(),
                    id: Some(id),
                    // Answering a message the recipient sent the caller
                    // passes its policy (not a block).
                    answers_recipient: id == target.sender_id && id != me,
                },
                name,
            })
            .collect();
        Ok((targets, Some(target.thread_id)))
    }
}

/// The error a send to `to` alone would have had for this refusal (`None`:
/// no such agent).
fn refusal(refusal: Option<&str>, to: &AgentName) -> PhoneError {
    match refusal {
        None => PhoneError::UnknownAgent(to.clone()),
        Some("send_quota") => PhoneError::Quota {
            what: "messages this hour",
        },
        Some("new_recipient_quota") => PhoneError::Quota {
            what: "first messages to new recipients today",
        },
        Some("inbox_full") => PhoneError::InboxFull(to.clone()),
        Some("inbox_share") => PhoneError::InboxShare(to.clone()),
        // The same words for a block and for every policy, so that a
        // block is not revealed.
        Some(_) => PhoneError::Refused(to.clone()),
    }
}

/// A send that fails on an unavailable database may have been stored all
/// the same (the connection died after the commit, or during a failover
/// before its answer): say how to retry without sending twice.
fn resend_hint(err: PhoneError, key: Option<&str>) -> PhoneError {
    match err {
        // Refused before anything was done: nothing to hint at.
        PhoneError::Unavailable(reason)
            if reason != store::POOL_BUSY && reason != store::NO_SYNC_STANDBY =>
        {
            PhoneError::Unavailable(match key {
                Some(_) => format!(
                    "{reason}; the message may have been stored before the failure: retry with the same \
                     idempotency_key, which stores it once"
                ),
                None => format!(
                    "{reason}; the message may have been stored before the failure: look at phone_outbox \
                     before sending it again (with an idempotency_key a retry is always safe)"
                ),
            })
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(to: &str, error: PhoneError) -> CopySent {
        CopySent {
            to: AgentName::parse("to", to).unwrap(),
            id: None,
            error: Some(error.to_string()),
        }
    }

    /// Each reason once; one that names no recipient names all it stopped,
    /// so that none goes unnamed.
    #[test]
    fn a_group_refusal_says_each_reason_once_and_names_everyone() {
        let name = |n: &str| AgentName::parse("to", n).unwrap();
        let quota = || PhoneError::Quota {
            what: "messages this hour",
        };
        let said = refusals_once(&[
            refused("a", quota()),
            refused("closed", PhoneError::Refused(name("closed"))),
            refused("c", quota()),
            refused("blocker", PhoneError::Refused(name("blocker"))),
        ]);
        assert_eq!(
            said,
            format!(
                "{} (for 'a', 'c'); {} (the same for 'blocker')",
                quota(),
                PhoneError::Refused(name("closed"))
            )
        );
        let alone = refusals_once(&[refused("solo", PhoneError::InboxFull(name("solo")))]);
        assert_eq!(alone, PhoneError::InboxFull(name("solo")).to_string());
    }
}
