//! A model of one event's delivery life cycle, checked exhaustively with `stateright`.
//!
//! The simulation samples runs of the real code; this model visits *every* interleaving of a
//! small abstraction of it: two deliver workers and a dead-letter writer sharing the delivery
//! and dead-letter queues (SQS: a received message is hidden, its visibility may run out and
//! another worker receive it; a delete with a receipt that is no longer current does nothing),
//! an endpoint that may take or refuse each attempt, a subscription that may be deleted and
//! created again under its name, and a process that may die at every step (its worker's
//! in-memory state is lost). Crashes and visibility expiries are bounded (three each) so the
//! state space is finite; within that bound the check is exhaustive.
//!
//! The steps follow the handlers' order: a worker receives, checks the message's subscription
//! id, attempts, enqueues what follows (a retry, or a dead-letter message when the attempts run
//! out), and only then deletes what it received; the writer writes the object, then deletes.
//! Two planted bugs show the properties can fail: [`LifeCycle::delete_first`] swaps the last
//! two steps (delete, then enqueue), which the rule of the house forbids, and
//! [`LifeCycle::ignore_identity`] attempts without the subscription-id check of item 5; the
//! checker finds the loss and the misdelivery they cause.

use stateright::{Model, Property};

/// Attempts before giving up (R5, scaled down).
const MAX_ATTEMPTS: u8 = 2;

/// A message on a queue: the event at an attempt count, for a subscription generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Message {
    pub dead_letter: bool,
    pub attempts: u8,
    pub generation: u8,
    /// Which worker holds it (received, hidden); `None`: visible.
    pub held_by: Option<u8>,
}

/// Where one deliver worker is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Worker {
    Idle,
    /// Holding a message it received.
    Received(Message),
    /// The attempt was made (or the message was for another subscription); what follows is
    /// to be enqueued (`None`: nothing) and then the received message deleted.
    Settled {
        received: Message,
        next: Option<Message>,
        enqueued: bool,
        deleted: bool,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub delivery: Vec<Message>,
    pub dead: Vec<Message>,
    pub workers: [Worker; 2],
    /// The dead-letter writer: the message it holds, and whether its object is written.
    pub writer: Option<(Message, bool)>,
    /// The subscription's generation now (a delete-and-create makes the next one).
    pub generation: u8,
    /// Whether the endpoint of each generation took the event (with a 2xx); it was published
    /// to generation 0 only.
    pub delivered_to: [bool; 2],
    /// Written to the dead-letter location.
    pub dead_lettered: bool,
    /// Dropped and counted (its subscription was replaced).
    pub dropped: bool,
    pub crashes_left: u8,
    pub expiries_left: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    Receive(u8, usize),
    Attempt(u8, bool),
    Enqueue(u8),
    Delete(u8),
    Crash(u8),
    Expire(usize),
    Recreate,
    WriterReceive(usize),
    WriterWrite,
    WriterDelete,
    WriterCrash,
    DeadExpire(usize),
}

/// The life cycle of one event published to generation 0 of a subscription.
#[derive(Clone, Copy, Debug, Default)]
pub struct LifeCycle {
    /// A planted bug: delete what was received before enqueuing what follows.
    pub delete_first: bool,
    /// A planted bug (the one item 5 fixed): attempt without checking that the message's
    /// subscription id is the subscription's now.
    pub ignore_identity: bool,
}

fn hold(queue: &mut [Message], i: usize, by: u8) -> Option<Message> {
    let m = queue.get_mut(i)?;
    if m.held_by.is_some() {
        return None;
    }
    m.held_by = Some(by);
    Some(*m)
}

/// Deletes the message `by` holds, if its receipt is still current.
fn delete_held(queue: &mut Vec<Message>, received: Message, by: u8) {
    if let Some(i) = queue.iter().position(|m| {
        m.held_by == Some(by)
            && (m.dead_letter, m.attempts, m.generation)
                == (received.dead_letter, received.attempts, received.generation)
    }) {
        queue.remove(i);
    }
}

/// A worker after a step of settling: idle once both steps are done.
fn settled(received: Message, next: Option<Message>, enqueued: bool, deleted: bool) -> Worker {
    if enqueued && deleted {
        Worker::Idle
    } else {
        Worker::Settled {
            received,
            next,
            enqueued,
            deleted,
        }
    }
}

impl Model for LifeCycle {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            delivery: vec![Message {
                dead_letter: false,
                attempts: 0,
                generation: 0,
                held_by: None,
            }],
            dead: Vec::new(),
            workers: [Worker::Idle; 2],
            writer: None,
            generation: 0,
            delivered_to: [false; 2],
            dead_lettered: false,
            dropped: false,
            crashes_left: 3,
            expiries_left: 3,
        }]
    }

    fn actions(&self, state: &State, actions: &mut Vec<Action>) {
        for w in 0..2u8 {
            match state.workers[usize::from(w)] {
                Worker::Idle => {
                    for (i, m) in state.delivery.iter().enumerate() {
                        if m.held_by.is_none() {
                            actions.push(Action::Receive(w, i));
                        }
                    }
                }
                Worker::Received(_) => {
                    actions.push(Action::Attempt(w, true));
                    actions.push(Action::Attempt(w, false));
                }
                Worker::Settled {
                    enqueued, deleted, ..
                } => {
                    // The handlers enqueue, then delete; the planted bug the other way round.
                    if !enqueued && (!self.delete_first || deleted) {
                        actions.push(Action::Enqueue(w));
                    }
                    if !deleted && (self.delete_first || enqueued) {
                        actions.push(Action::Delete(w));
                    }
                }
            }
            if state.crashes_left > 0 && state.workers[usize::from(w)] != Worker::Idle {
                actions.push(Action::Crash(w));
            }
        }
        if state.expiries_left > 0 {
            for (i, m) in state.delivery.iter().enumerate() {
                if m.held_by.is_some() {
                    actions.push(Action::Expire(i));
                }
            }
            for (i, m) in state.dead.iter().enumerate() {
                if m.held_by.is_some() {
                    actions.push(Action::DeadExpire(i));
                }
            }
        }
        if state.generation == 0 {
            actions.push(Action::Recreate);
        }
        match state.writer {
            None => {
                for (i, m) in state.dead.iter().enumerate() {
                    if m.held_by.is_none() {
                        actions.push(Action::WriterReceive(i));
                    }
                }
            }
            Some((_, written)) => {
                actions.push(if written {
                    Action::WriterDelete
                } else {
                    Action::WriterWrite
                });
                if state.crashes_left > 0 {
                    actions.push(Action::WriterCrash);
                }
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Receive(w, i) => {
                let m = hold(&mut s.delivery, i, w)?;
                s.workers[usize::from(w)] = Worker::Received(m);
            }
            Action::Attempt(w, taken) => {
                let Worker::Received(m) = s.workers[usize::from(w)] else {
                    return None;
                };
                let next = if m.generation != s.generation && !self.ignore_identity {
                    // Item 5: for a subscription that is no longer there: dropped, counted.
                    s.dropped = true;
                    None
                } else if taken {
                    // The request goes to the endpoint of the subscription of that name now.
                    s.delivered_to[usize::from(s.generation)] = true;
                    None
                } else {
                    Some(Message {
                        dead_letter: m.attempts + 1 >= MAX_ATTEMPTS,
                        attempts: m.attempts + 1,
                        generation: m.generation,
                        held_by: None,
                    })
                };
                s.workers[usize::from(w)] = Worker::Settled {
                    received: m,
                    next,
                    enqueued: false,
                    deleted: false,
                };
            }
            Action::Enqueue(w) => {
                let Worker::Settled {
                    received,
                    next,
                    deleted,
                    ..
                } = s.workers[usize::from(w)]
                else {
                    return None;
                };
                if let Some(n) = next {
                    if n.dead_letter {
                        s.dead.push(n);
                    } else {
                        s.delivery.push(n);
                    }
                }
                s.workers[usize::from(w)] = settled(received, next, true, deleted);
            }
            Action::Delete(w) => {
                let Worker::Settled {
                    received,
                    next,
                    enqueued,
                    ..
                } = s.workers[usize::from(w)]
                else {
                    return None;
                };
                delete_held(&mut s.delivery, received, w);
                s.workers[usize::from(w)] = settled(received, next, enqueued, true);
            }
            Action::Crash(w) => {
                s.crashes_left -= 1;
                s.workers[usize::from(w)] = Worker::Idle;
            }
            Action::Expire(i) => {
                s.expiries_left -= 1;
                s.delivery.get_mut(i)?.held_by = None;
            }
            Action::DeadExpire(i) => {
                s.expiries_left -= 1;
                s.dead.get_mut(i)?.held_by = None;
            }
            Action::Recreate => s.generation = 1,
            Action::WriterReceive(i) => {
                let m = hold(&mut s.dead, i, 9)?;
                s.writer = Some((m, false));
            }
            Action::WriterWrite => {
                let (m, _) = s.writer?;
                s.dead_lettered = true;
                s.writer = Some((m, true));
            }
            Action::WriterDelete => {
                let (m, _) = s.writer?;
                delete_held(&mut s.dead, m, 9);
                s.writer = None;
            }
            Action::WriterCrash => {
                s.crashes_left -= 1;
                s.writer = None;
            }
        }
        s.delivery.sort();
        s.dead.sort();
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            // G1: the event is always somewhere: delivered, dead-lettered, dropped and counted,
            // or on a queue (what a worker holds in memory does not count: it may die).
            Property::always("no event is ever lost", |_, s: &State| {
                s.delivered_to[0]
                    || s.dead_lettered
                    || s.dropped
                    || !s.delivery.is_empty()
                    || !s.dead.is_empty()
            }),
            // Item 5: never to the endpoint of a subscription created after the event.
            Property::always("never delivered to another subscription", |_, s: &State| {
                !s.delivered_to[1]
            }),
            // The model reaches each end, so the properties are not met by standing still.
            Property::sometimes("delivered", |_, s: &State| s.delivered_to[0]),
            Property::sometimes("dead-lettered", |_, s: &State| s.dead_lettered),
            Property::sometimes("dropped for a replaced subscription", |_, s: &State| {
                s.dropped
            }),
        ]
    }
}
