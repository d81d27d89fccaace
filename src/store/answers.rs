//! One-shot answers made in blocks: a sender hands one value to one receiver, as tokio's
//! `oneshot`, but a block of [`BLOCK`] answers is one allocation, so that queueing a decision
//! for a batch allocates nothing of its own.
//!
//! Each answer has its own slot in its block and its own lock, held only to move a value or a
//! waker in or out; the block lives while any sender or receiver of it does.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};

/// The answers one allocation holds.
pub(crate) const BLOCK: usize = 64;

/// Where new answers are made: the block in use, and its next free slot.
pub(crate) struct Answers<T> {
    block: Option<Arc<[Slot<T>]>>,
    next: usize,
}

impl<T> Default for Answers<T> {
    fn default() -> Self {
        Answers {
            block: None,
            next: 0,
        }
    }
}

impl<T> Answers<T> {
    /// A new answer's two ends, in the block in use, or in a new one when it is full.
    pub(crate) fn channel(&mut self) -> (Sender<T>, Receiver<T>) {
        let block = match &self.block {
            Some(block) if self.next < block.len() => block.clone(),
            _ => {
                let block: Arc<[Slot<T>]> = (0..BLOCK).map(|_| Slot::default()).collect();
                self.block = Some(block.clone());
                self.next = 0;
                block
            }
        };
        let index = self.next;
        self.next += 1;
        let end = End { block, index };
        (
            Sender {
                end: End {
                    block: end.block.clone(),
                    index,
                },
            },
            Receiver { end },
        )
    }
}

/// One answer's slot.
struct Slot<T> {
    state: Mutex<State<T>>,
}

impl<T> Default for Slot<T> {
    fn default() -> Self {
        Slot {
            state: Mutex::new(State::Waiting(None)),
        }
    }
}

/// Where an answer is.
enum State<T> {
    /// Not sent yet: the receiver's waker, once it has polled.
    Waiting(Option<Waker>),
    /// Sent, not received yet.
    Sent(T),
    /// Received, or its receiver gone: the sender's value, if any came, is dropped.
    Closed,
    /// The sender went away without sending.
    Unsent,
}

/// An answer's slot in its block.
struct End<T> {
    block: Arc<[Slot<T>]>,
    index: usize,
}

impl<T> End<T> {
    fn state(&self) -> MutexGuard<'_, State<T>> {
        self.block[self.index]
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

/// The end that sends an answer.
pub(crate) struct Sender<T> {
    end: End<T>,
}

impl<T> Sender<T> {
    /// Sends `value`; it comes back when the receiver is gone.
    pub(crate) fn send(self, value: T) -> Result<(), T> {
        let mut state = self.end.state();
        match std::mem::replace(&mut *state, State::Closed) {
            State::Waiting(waker) => {
                *state = State::Sent(value);
                drop(state);
                if let Some(waker) = waker {
                    waker.wake();
                }
                Ok(())
            }
            other => {
                *state = other;
                Err(value)
            }
        }
    }

    /// Whether the receiver is gone: nobody waits for an answer.
    pub(crate) fn is_closed(&self) -> bool {
        matches!(*self.end.state(), State::Closed)
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let mut state = self.end.state();
        if let State::Waiting(waker) = &mut *state {
            let waker = waker.take();
            *state = State::Unsent;
            drop(state);
            if let Some(waker) = waker {
                waker.wake();
            }
        }
    }
}

/// The sender went away without sending.
#[derive(Debug)]
pub(crate) struct Unsent;

/// The end that waits for an answer: a future of the value, or [`Unsent`].
pub(crate) struct Receiver<T> {
    end: End<T>,
}

impl<T> Future for Receiver<T> {
    type Output = Result<T, Unsent>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.end.state();
        match std::mem::replace(&mut *state, State::Closed) {
            State::Sent(value) => Poll::Ready(Ok(value)),
            State::Unsent | State::Closed => Poll::Ready(Err(Unsent)),
            State::Waiting(waker) => {
                let waker = match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => waker,
                    _ => cx.waker().clone(),
                };
                *state = State::Waiting(Some(waker));
                Poll::Pending
            }
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // A value sent and never received is dropped here, outside no lock of the caller's.
        let left = std::mem::replace(&mut *self.end.state(), State::Closed);
        drop(left);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_sent_value_is_received_once() {
        let mut answers = Answers::default();
        let (sender, mut receiver) = answers.channel();
        assert!(sender.send(7).is_ok());
        assert_eq!(
            (&mut receiver).now_or_never().map(Result::ok),
            Some(Some(7))
        );
    }

    #[test]
    fn a_receiver_waits_then_is_woken_by_the_send() {
        let mut answers = Answers::default();
        let (sender, receiver) = answers.channel();
        let mut receiver = polled(receiver);
        assert!(receiver.poll().is_pending());
        sender.send("answer").unwrap();
        assert!(receiver.woken());
        assert!(matches!(receiver.poll(), Poll::Ready(Ok("answer"))));
    }

    #[test]
    fn a_sender_dropped_unsent_wakes_its_receiver_with_unsent() {
        let mut answers = Answers::<u8>::default();
        let (sender, receiver) = answers.channel();
        let mut receiver = polled(receiver);
        assert!(receiver.poll().is_pending());
        drop(sender);
        assert!(receiver.woken());
        assert!(matches!(receiver.poll(), Poll::Ready(Err(Unsent))));
    }

    #[test]
    fn a_receiver_gone_closes_its_sender_and_refuses_the_value() {
        let mut answers = Answers::default();
        let (sender, receiver) = answers.channel();
        assert!(!sender.is_closed());
        drop(receiver);
        assert!(sender.is_closed());
        assert_eq!(sender.send(3), Err(3));
    }

    #[test]
    fn a_value_never_received_is_dropped_with_its_receiver() {
        let value = Arc::new(());
        let mut answers = Answers::default();
        let (sender, receiver) = answers.channel();
        sender.send(value.clone()).unwrap();
        assert_eq!(Arc::strong_count(&value), 2);
        drop(receiver);
        assert_eq!(Arc::strong_count(&value), 1);
    }

    #[test]
    fn answers_past_a_block_go_to_a_new_block_and_each_keeps_its_own_value() {
        let mut answers = Answers::default();
        let channels: Vec<_> = (0..BLOCK * 2 + 3).map(|_| answers.channel()).collect();
        let mut receivers = Vec::new();
        for (n, (sender, receiver)) in channels.into_iter().enumerate() {
            sender.send(n).unwrap();
            receivers.push(receiver);
        }
        let blocks: std::collections::HashSet<_> = receivers
            .iter()
            .map(|receiver| Arc::as_ptr(&receiver.end.block) as *const u8 as usize)
            .collect();
        assert_eq!(blocks.len(), 3);
        for (n, receiver) in receivers.into_iter().enumerate() {
            assert_eq!(receiver.now_or_never().map(Result::ok), Some(Some(n)));
        }
    }

    /// A receiver polled by hand, with a waker that records its wake.
    fn polled<T>(receiver: Receiver<T>) -> Polled<T> {
        Polled {
            receiver: Box::pin(receiver),
            woken: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    struct Polled<T> {
        receiver: Pin<Box<Receiver<T>>>,
        woken: Arc<std::sync::atomic::AtomicBool>,
    }

    struct Flag(Arc<std::sync::atomic::AtomicBool>);

    impl std::task::Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }

    impl<T> Polled<T> {
        fn poll(&mut self) -> Poll<Result<T, Unsent>> {
            let waker = Waker::from(Arc::new(Flag(self.woken.clone())));
            self.receiver
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
        }

        fn woken(&self) -> bool {
            self.woken.load(std::sync::atomic::Ordering::SeqCst)
        }
    }
}
