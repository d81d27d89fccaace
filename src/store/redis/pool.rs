//! [`Pool`]: a store's connections (one by default, `RedisStoreBuilder::connections`), taken in
//! turn by its calls.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::future::try_join_all;

use super::connection::Replaceable;
use super::server::ServerInfo;
use crate::store::StoreError;

/// `n` independent [`Replaceable`] connections, each opened in the background and replaced when
/// stale on its own, exactly as a single one is. Calls take them round robin: one counter, no
/// lock. A call that lands on a connection still being made waits for it, within its timeout,
/// as with one connection.
pub(super) struct Pool<C> {
    connections: Box<[Replaceable<C>]>,
    next: AtomicUsize,
}

impl<C: Clone + Send + Sync + 'static> Pool<C> {
    /// `n` connections, each made by `connection()` (which may fail: a malformed setting).
    pub(super) fn new<E>(
        n: NonZeroUsize,
        connection: impl FnMut() -> Result<Replaceable<C>, E>,
    ) -> Result<Self, E> {
        Ok(Pool {
            connections: std::iter::repeat_with(connection)
                .take(n.get())
                .collect::<Result<_, E>>()?,
            next: AtomicUsize::new(0),
        })
    }

    /// The connection for the next call.
    #[inline]
    pub(super) fn next(&self) -> &Replaceable<C> {
        match &*self.connections {
            // The default: no shared counter to bump on every call.
            [only] => only,
            all => &all[self.next.fetch_add(1, Ordering::Relaxed) % all.len()],
        }
    }

    /// Every connection, waited for together (each started if it is not running): the first
    /// one's server, which the others reach too.
    pub(super) async fn wait_ready(&self) -> Result<(Vec<C>, ServerInfo), StoreError> {
        let ready = try_join_all(self.connections.iter().map(Replaceable::wait_ready)).await?;
        let server = ready.first().map(|(_, server)| server.clone());
        let connections = ready
            .into_iter()
            .map(|(connection, _)| connection)
            .collect();
        Ok((connections, server.unwrap_or_default()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::future::FutureExt;
    use redis::RedisError;

    fn never() -> Replaceable<()> {
        Replaceable::new(Box::new(|| {
            futures::future::pending::<Result<((), ServerInfo), RedisError>>().boxed()
        }))
    }

    #[test]
    fn calls_take_the_connections_in_turn() {
        let pool = Pool::new(NonZeroUsize::new(3).unwrap(), || Ok::<_, ()>(never())).unwrap();
        let picked: Vec<*const Replaceable<()>> = (0..6).map(|_| pool.next() as *const _).collect();
        assert_ne!(picked[0], picked[1]);
        assert_ne!(picked[1], picked[2]);
        assert_ne!(picked[0], picked[2]);
        assert_eq!(picked[..3], picked[3..], "round robin");

        let one = Pool::new(NonZeroUsize::MIN, || Ok::<_, ()>(never())).unwrap();
        assert!(std::ptr::eq(one.next(), one.next()));
    }
}
