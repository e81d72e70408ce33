//! An `Onboard`'s answer: its blocks on their way to the client. Each block is charged
//! to the lease budget from when it is read until the client has taken the next one
//! (till then its encoded copy may still wait in the connection), and a client that
//! leaves a block untaken for `--grpc-message-timeout` is cut off with its connection.
//! A client that stops reading would otherwise hold its answer's blocks, and the
//! budget they are charged to, for as long as its connection lives: HTTP/2 flow control
//! stalls the answer where no handler can reach it.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use dynamo_kvblocks::pb;
use dynamo_server::GrpcConnectInfo;
use futures::Stream;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{mpsc, watch};
use tonic::Status;

use super::budget::Charge;

/// Blocks read ahead of a slow client.
const AHEAD: usize = 4;

/// The end an answer's blocks are handed to.
pub struct Answer {
    blocks: mpsc::Sender<(pb::Block, Charge)>,
    /// How many blocks the client has taken; closed once the answer is over.
    taken: watch::Receiver<u64>,
    cutter: Cutter,
}

/// What cuts off a client that stopped reading.
struct Cutter {
    timeout: Duration,
    connection: Option<GrpcConnectInfo>,
    cut: Counter,
}

/// The answer as tonic sends it.
pub struct Taken {
    blocks: mpsc::Receiver<(pb::Block, Charge)>,
    /// The charge of the block taken last.
    last: Option<Charge>,
    taken: watch::Sender<u64>,
}

/// An answer to the client on `connection` (none: it is never cut off), which must take
/// each block within `timeout`; cut-offs are counted in `cut`.
pub fn answer(
    timeout: Duration,
    connection: Option<GrpcConnectInfo>,
    cut: Counter,
) -> (Answer, Taken) {
    let (blocks, rx) = mpsc::channel(AHEAD);
    let (counted, taken) = watch::channel(0);
    let cutter = Cutter {
        timeout,
        connection,
        cut,
    };
    let answer = Answer {
        blocks,
        taken,
        cutter,
    };
    let stream = Taken {
        blocks: rx,
        last: None,
        taken: counted,
    };
    (answer, stream)
}

impl Answer {
    /// Hands `block`, with its `charge`, to the client; false once the client is gone
    /// or has been cut off.
    pub async fn send(&mut self, block: pb::Block, charge: Charge) -> bool {
        let sent = self.blocks.send((block, charge));
        match tokio::time::timeout(self.cutter.timeout, sent).await {
            Ok(sent) => sent.is_ok(),
            Err(_) => {
                self.cutter.cut_off();
                false
            }
        }
    }

    /// Waits for the client to take the rest of the answer, and cuts it off if it
    /// stops taking it.
    pub async fn finish(self) {
        let Self {
            blocks,
            mut taken,
            cutter,
        } = self;
        drop(blocks);
        loop {
            match tokio::time::timeout(cutter.timeout, taken.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return,
                Err(_) => return cutter.cut_off(),
            }
        }
    }
}

impl Cutter {
    fn cut_off(&self) {
        tracing::info!(
            timeout = ?self.timeout,
            "cutting off a block API client that stopped reading its answer"
        );
        self.cut.inc();
        if let Some(connection) = &self.connection {
            connection.cut();
        }
    }
}

impl Stream for Taken {
    type Item = Result<pb::Block, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let Poll::Ready(next) = self.blocks.poll_recv(cx) else {
            return Poll::Pending;
        };
        // Asked for more, tonic has passed the last block's copy on to the connection.
        self.last = None;
        Poll::Ready(next.map(|(block, charge)| {
            self.last = Some(charge);
            self.taken.send_modify(|n| *n += 1);
            Ok(block)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocks::budget::LeaseBudget;
    use futures::StreamExt;
    use prometheus_client::metrics::gauge::Gauge;

    fn block() -> pb::Block {
        pb::Block::from(&crate::blocks::test_block(1, None, b"abcd"))
    }

    #[tokio::test(start_paused = true)]
    async fn blocks_are_charged_until_taken_and_a_client_that_stops_is_cut_off() {
        let budget = LeaseBudget::new(100, 100, Gauge::default());
        let cut = Counter::default();
        let timeout = Duration::from_secs(1);
        let (mut answer, mut taken) = answer(timeout, None, cut.clone());
        for _ in 0..AHEAD {
            let charge = budget.charge(None, 4).unwrap();
            assert!(answer.send(block(), charge).await);
        }
        assert_eq!(budget.held(), 16);
        assert!(taken.next().await.unwrap().is_ok());
        assert_eq!(budget.held(), 16, "the block taken last is still charged");
        assert!(taken.next().await.unwrap().is_ok());
        assert_eq!(budget.held(), 12);
        // The client takes nothing more: once the blocks read ahead fill up, the next
        // waits a timeout, then the client is cut off.
        for _ in 0..2 {
            let charge = budget.charge(None, 4).unwrap();
            assert!(answer.send(block(), charge).await);
        }
        assert_eq!(cut.get(), 0);
        let charge = budget.charge(None, 4).unwrap();
        assert!(!answer.send(block(), charge).await);
        assert_eq!(cut.get(), 1);
        drop(taken);
        assert_eq!(budget.held(), 0, "a dropped answer holds nothing");
    }

    #[tokio::test(start_paused = true)]
    async fn a_finished_answer_waits_for_its_client_to_take_it_whole() {
        let cut = Counter::default();
        let (mut answer, mut taken) = answer(Duration::from_secs(1), None, cut.clone());
        let budget = LeaseBudget::new(100, 100, Gauge::default());
        for _ in 0..2 {
            assert!(answer.send(block(), budget.open(None)).await);
        }
        let reader = tokio::spawn(async move {
            while let Some(block) = taken.next().await {
                block.unwrap();
                tokio::time::sleep(Duration::from_millis(900)).await;
            }
        });
        answer.finish().await;
        reader.await.unwrap();
        assert_eq!(
            cut.get(),
            0,
            "a slow client that keeps reading is not cut off"
        );

        let (mut answer, _never_read) = super::answer(Duration::from_secs(1), None, cut.clone());
        assert!(answer.send(block(), budget.open(None)).await);
        answer.finish().await;
        assert_eq!(cut.get(), 1);
    }
}
