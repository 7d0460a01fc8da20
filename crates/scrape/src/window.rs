//! The bounded list the merged scrape shares between its readers: a
//! producer appends items (Envoy's lines, or their deflate blocks), readers
//! walk it each at its own pace through a [`Cursor`], and no more than a
//! window's worth of bytes is held:
//!
//! - items every reader has passed are dropped once the window is full (not
//!   before: a small body stays whole, so a scrape that comes later can
//!   still share it from its start);
//! - the producer waits for room (back-pressure: the reads follow the
//!   slowest reader, and Envoy's body is never held whole);
//! - a reader that holds the window full for [`STALL`] while another reader
//!   waits at its head is let go: its next read ends with
//!   [`Incomplete::Slow`] at a line boundary (its Envoy part ends there;
//!   lifeguard's part follows), so one stalled client stalls no other and
//!   grows nothing;
//! - with no reader left and the window full, there is no one to read for:
//!   the producer stops.
//!
//! A reader can only start at the first item, so only a list whose start
//! is still held can be joined.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::counters::Incomplete;

/// How long a reader may hold the window full while another waits.
pub(crate) const STALL: Duration = Duration::from_secs(2);

/// How a list ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    Complete,
    Cut(Incomplete),
}

/// An item's size, for the window.
pub(crate) trait Weight {
    fn weight(&self) -> usize;
}

impl Weight for Bytes {
    fn weight(&self) -> usize {
        self.len()
    }
}

/// A shared list with a bounded window; see the module doc.
pub(crate) struct List<T> {
    tx: watch::Sender<Chunks<T>>,
    window: usize,
}

struct Chunks<T> {
    items: VecDeque<T>,
    /// The index of `items[0]` in the whole list.
    base: usize,
    /// Bytes held in `items`.
    held: usize,
    end: Option<End>,
    /// Each reader's next index, by reader id.
    cursors: BTreeMap<u64, usize>,
    next_id: u64,
}

impl<T> Chunks<T> {
    fn len(&self) -> usize {
        self.base + self.items.len()
    }

    fn slowest(&self) -> Option<usize> {
        self.cursors.values().copied().min()
    }
}

/// What a reader gets next.
pub(crate) enum Next<T> {
    Item(T),
    End(End),
    Timeout,
}

/// One reader's place in a list; it leaves the list when dropped.
pub(crate) struct Cursor<T> {
    list: Arc<List<T>>,
    id: u64,
    next: usize,
}

impl<T: Clone + Weight> List<T> {
    /// A list holding at most about `window` bytes (one item more at most).
    pub(crate) fn new(window: usize) -> Arc<Self> {
        Arc::new(Self {
            tx: watch::Sender::new(Chunks {
                items: VecDeque::new(),
                base: 0,
                held: 0,
                end: None,
                cursors: BTreeMap::new(),
                next_id: 0,
            }),
            window,
        })
    }

    /// A reader from the first item; None once that item is gone.
    pub(crate) fn join(self: &Arc<Self>) -> Option<Cursor<T>> {
        let mut id = None;
        self.tx.send_if_modified(|c| {
            if c.base == 0 {
                let new = c.next_id;
                c.next_id += 1;
                c.cursors.insert(new, 0);
                id = Some(new);
            }
            false
        });
        Some(Cursor {
            list: self.clone(),
            id: id?,
            next: 0,
        })
    }

    /// Whether the first item is still held (the list may be joined).
    pub(crate) fn holds_start(&self) -> bool {
        self.tx.borrow().base == 0
    }

    pub(crate) fn push(&self, item: T) {
        self.tx.send_modify(|c| {
            c.held += item.weight();
            c.items.push_back(item);
        });
    }

    pub(crate) fn end(&self, end: End) {
        self.tx.send_modify(|c| {
            c.end.get_or_insert(end);
        });
    }

    pub(crate) fn ended(&self) -> Option<End> {
        self.tx.borrow().end
    }

    /// The number of items pushed so far.
    pub(crate) fn len(&self) -> usize {
        self.tx.borrow().len()
    }

    /// Calls `f` on the items from index `from` (those still held).
    pub(crate) fn each_from(&self, from: usize, mut f: impl FnMut(&T)) {
        let chunks = self.tx.borrow();
        chunks
            .items
            .iter()
            .skip(from.saturating_sub(chunks.base))
            .for_each(&mut f);
    }

    /// Drops the items every reader has passed while more than the window
    /// is held; whether the window has room now.
    fn trim(&self) -> bool {
        let mut room = false;
        self.tx.send_if_modified(|c| {
            let keep_from = c.slowest().unwrap_or(c.len());
            let mut dropped = false;
            while c.held > self.window && c.base < keep_from {
                let Some(item) = c.items.pop_front() else { break };
                c.held -= item.weight();
                c.base += 1;
                dropped = true;
            }
            room = c.held <= self.window;
            dropped
        });
        room
    }

    /// Waits until the window has room for the producer, until `deadline`.
    /// Err: no reader is left (stop), or the deadline passed.
    pub(crate) async fn room(&self, deadline: Instant) -> Result<(), End> {
        let mut rx = self.tx.subscribe();
        let mut stalled_since = Instant::now();
        loop {
            {
                let c = rx.borrow_and_update();
                if c.held <= self.window {
                    return Ok(());
                }
                if c.cursors.is_empty() {
                    return Err(End::Cut(Incomplete::Slow));
                }
            }
            if self.trim() {
                return Ok(());
            }
            let wake = deadline.min(stalled_since + STALL);
            match tokio::time::timeout_at(wake, rx.changed()).await {
                Ok(Ok(())) => continue,
                Ok(Err(_)) => return Err(End::Cut(Incomplete::Error)),
                Err(_) if Instant::now() >= deadline => return Err(End::Cut(Incomplete::Timeout)),
                Err(_) => {
                    self.let_go_of_the_slowest();
                    stalled_since = Instant::now();
                }
            }
        }
    }

    /// The window stayed full: the readers at the slowest place are let go
    /// when another reader waits at the head (one that is as slow as
    /// everyone is only back-pressure).
    fn let_go_of_the_slowest(&self) {
        self.tx.send_if_modified(|c| {
            let (Some(slowest), head) = (c.slowest(), c.len()) else {
                return false;
            };
            if !c.cursors.values().any(|&n| n >= head) {
                return false;
            }
            c.cursors.retain(|_, n| *n > slowest);
            true
        });
    }
}

impl<T: Clone + Weight> Cursor<T> {
    /// The next item, waiting for it until `deadline` (None: no deadline).
    pub(crate) async fn next(&mut self, deadline: Option<Instant>) -> Next<T> {
        let (i, id) = (self.next, self.id);
        let mut rx = self.list.tx.subscribe();
        let wait = rx.wait_for(|c| c.len() > i || c.end.is_some() || !c.cursors.contains_key(&id));
        let chunks = match deadline {
            Some(deadline) => match tokio::time::timeout_at(deadline, wait).await {
                Ok(chunks) => chunks,
                Err(_) => return Next::Timeout,
            },
            None => wait.await,
        };
        // The sender lives in the list we hold: it cannot be gone.
        let Ok(chunks) = chunks else {
            return Next::End(End::Cut(Incomplete::Error));
        };
        if !chunks.cursors.contains_key(&id) || i < chunks.base {
            return Next::End(End::Cut(Incomplete::Slow));
        }
        let item = match chunks.items.get(i - chunks.base) {
            Some(item) => item.clone(),
            None => return Next::End(chunks.end.unwrap_or(End::Cut(Incomplete::Error))),
        };
        drop(chunks);
        self.next = i + 1;
        // Tell the producer only when this reader was holding the window.
        self.list.tx.send_if_modified(|c| {
            let was_slowest = c.slowest() == Some(i);
            if let Some(n) = c.cursors.get_mut(&id) {
                *n = i + 1;
            }
            was_slowest && c.held > self.list.window
        });
        Next::Item(item)
    }
}

impl<T> Drop for Cursor<T> {
    fn drop(&mut self) {
        let id = self.id;
        self.list.tx.send_if_modified(|c| c.cursors.remove(&id).is_some());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    #[tokio::test(start_paused = true)]
    async fn a_small_list_stays_whole_and_can_be_joined_after_its_end() {
        let list = List::new(100);
        let mut a = list.join().unwrap();
        for _ in 0..5 {
            list.push(bytes(10));
            list.room(Instant::now() + STALL).await.unwrap();
        }
        list.end(End::Complete);
        let mut b = list.join().expect("the start is still held");
        for cursor in [&mut a, &mut b] {
            let mut n = 0;
            while let Next::Item(_) = cursor.next(None).await {
                n += 1;
            }
            assert_eq!(n, 5);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_producer_waits_for_the_slowest_reader_and_memory_stays_bounded() {
        let list = List::new(100);
        let mut reader = list.join().unwrap();
        let producer = {
            let list = list.clone();
            tokio::spawn(async move {
                for _ in 0..100 {
                    list.push(bytes(10));
                    if let Err(end) = list.room(Instant::now() + Duration::from_secs(60)).await {
                        return Some(end);
                    }
                    assert!(list.tx.borrow().held <= 110);
                }
                list.end(End::Complete);
                None
            })
        };
        let mut n = 0;
        while let Next::Item(_) = reader.next(None).await {
            n += 1;
            tokio::task::yield_now().await;
        }
        assert_eq!(n, 100, "a slow reader alone gets everything");
        assert_eq!(producer.await.unwrap(), None);
        assert!(!list.holds_start(), "the start was dropped: no one can join");
        assert!(list.join().is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_stalled_reader_is_let_go_and_the_others_go_on() {
        let list = List::new(100);
        let mut stalled = list.join().unwrap();
        let mut fast = list.join().unwrap();
        let producer = {
            let list = list.clone();
            tokio::spawn(async move {
                for _ in 0..100 {
                    list.push(bytes(10));
                    list.room(Instant::now() + Duration::from_secs(60)).await.unwrap();
                }
                list.end(End::Complete);
            })
        };
        let Next::Item(_) = stalled.next(None).await else {
            panic!()
        };
        let mut n = 0;
        while let Next::Item(_) = fast.next(None).await {
            n += 1;
        }
        assert_eq!(n, 100);
        producer.await.unwrap();
        assert!(matches!(
            stalled.next(None).await,
            Next::End(End::Cut(Incomplete::Slow))
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn with_no_reader_left_a_full_window_stops_the_producer() {
        let list = List::new(10);
        drop(list.join().unwrap());
        list.push(bytes(20));
        assert_eq!(list.room(Instant::now() + STALL).await, Err(End::Cut(Incomplete::Slow)));
    }
}
