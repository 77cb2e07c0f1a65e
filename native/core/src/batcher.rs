//! One batch former: the pending queue of one (model, operation, LoRA) key, its flush triggers and
//! its cost-sorted packing (scheduler-and-prep §3.1-3.5, v0.7.1 rules; no runs-alone lanes).
//!
//! Items are opaque `u64` handles with a cost; the caller keeps the items themselves. Time is
//! passed in (seconds on any monotonic clock), so the former is deterministic under test.

/// Caps and timers of one former (§3.1), replaced as a whole by the adaptive controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BatchConfig {
    pub max_batch_cost: u64,
    pub max_batch_requests: usize,
    pub max_batch_wait_ms: f64,
    pub coalesce_ms: f64,
    pub coalesce_ratio: f64,
}

impl Default for BatchConfig {
    /// The Rust sidecar's v0.7.1 defaults: 16384 / 12 / 15 ms / 5 ms / 0.5.
    fn default() -> Self {
        Self {
            max_batch_cost: 16384,
            max_batch_requests: 12,
            max_batch_wait_ms: 15.0,
            coalesce_ms: 5.0,
            coalesce_ratio: 0.5,
        }
    }
}

impl BatchConfig {
    /// `min(coalesce_ms, max_batch_wait_ms × coalesce_ratio)`.
    pub fn effective_coalesce_ms(&self) -> f64 {
        self.coalesce_ms
            .min(self.max_batch_wait_ms * self.coalesce_ratio)
    }
}

/// Why a batch left the former; the labels are the telemetry vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushReason {
    CostCap,
    CountCap,
    Timeout,
    Coalesce,
    SingleOversize,
    IdleBypass,
    Drain,
}

impl FlushReason {
    pub fn label(self) -> &'static str {
        match self {
            Self::CostCap => "cost_cap",
            Self::CountCap => "count_cap",
            Self::Timeout => "timeout",
            Self::Coalesce => "coalesce",
            Self::SingleOversize => "single_oversize",
            Self::IdleBypass => "idle_bypass",
            Self::Drain => "drain",
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Pending {
    id: u64,
    cost: u64,
    arrival: f64,
    hard_cap: Option<u64>,
    /// Never shares a batch (newer than v0.7.1: long-form prepared audio, §2.3).
    alone: bool,
}

/// A formed batch: handles in packing order (cost ascending, FIFO among equals).
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub ids: Vec<u64>,
    pub total_cost: u64,
    pub reason: FlushReason,
}

/// The pending state of one former (§3.2).
#[derive(Debug, Clone, Default)]
pub struct Batcher {
    pending: Vec<Pending>,
    total_cost: u64,
    /// The smallest `hard_cap` of the pending items (kept up to date: `effective_max_cost` runs
    /// on every submit, and scanning the queue there made a group's submit quadratic).
    min_hard_cap: Option<u64>,
    /// How many pending items run alone (0: plain cost-sorted packing, exactly v0.7.1's).
    alone_count: usize,
    /// Whether the previous batch was a runs-alone one (the two lanes take turns, §3.5).
    last_batch_alone: Option<bool>,
    first_request_time: Option<f64>,
    last_submit_time: Option<f64>,
    config: BatchConfig,
}

fn ms_since(now: f64, then: f64) -> f64 {
    (now - then) * 1000.0
}

impl Batcher {
    pub fn new(config: BatchConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    pub fn config(&self) -> BatchConfig {
        self.config
    }

    /// Replace the caps (controller step); true when the queue became flushable.
    pub fn update_config(&mut self, config: BatchConfig, now: f64) -> bool {
        self.config = config;
        self.flush_reason(now, false).is_some()
    }

    pub fn len(&self) -> usize {
        self.pending.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    pub fn total_cost(&self) -> u64 {
        self.total_cost
    }

    /// Arrival of the oldest pending item (the FCFS key across formers), `None` when empty.
    pub fn head_arrival(&self) -> Option<f64> {
        self.pending.iter().map(|p| p.arrival).reduce(f64::min)
    }

    /// `min(config cap, every pending item's hard cap)`.
    pub fn effective_max_cost(&self) -> u64 {
        self.min_hard_cap.map_or(self.config.max_batch_cost, |cap| {
            cap.min(self.config.max_batch_cost)
        })
    }

    fn recompute_min_hard_cap(&mut self) {
        self.min_hard_cap = self.pending.iter().filter_map(|p| p.hard_cap).min();
    }

    /// Append one item (§3.3); true when the consumer should wake (flushable now, or first item).
    pub fn submit(&mut self, id: u64, cost: u64, now: f64, hard_cap: Option<u64>) -> bool {
        self.submit_item(id, cost, now, hard_cap, false)
    }

    /// `submit`, for an item that may run alone (it never shares a batch).
    pub fn submit_item(
        &mut self,
        id: u64,
        cost: u64,
        now: f64,
        hard_cap: Option<u64>,
        alone: bool,
    ) -> bool {
        self.pending.push(Pending {
            id,
            cost,
            arrival: now,
            hard_cap,
            alone,
        });
        self.alone_count += usize::from(alone);
        self.total_cost = self.total_cost.saturating_add(cost);
        if let Some(cap) = hard_cap {
            self.min_hard_cap = Some(self.min_hard_cap.map_or(cap, |m| m.min(cap)));
        }
        self.last_submit_time = Some(now);
        let first = self.first_request_time.is_none();
        if first {
            self.first_request_time = Some(now);
        }
        first || self.flush_reason(now, false).is_some()
    }

    /// The first matching trigger of §3.4, or `None`.
    pub fn flush_reason(&self, now: f64, immediate: bool) -> Option<FlushReason> {
        if self.pending.is_empty() {
            return None;
        }
        let cap = self.effective_max_cost();
        if self.pending.len() == 1 && self.total_cost > cap {
            return Some(FlushReason::SingleOversize);
        }
        if self.total_cost >= cap {
            return Some(FlushReason::CostCap);
        }
        if self.pending.len() >= self.config.max_batch_requests {
            return Some(FlushReason::CountCap);
        }
        if let Some(first) = self.first_request_time {
            if ms_since(now, first) >= self.config.max_batch_wait_ms {
                return Some(FlushReason::Timeout);
            }
        }
        if let Some(last) = self.last_submit_time {
            if ms_since(now, last) >= self.config.effective_coalesce_ms() {
                return Some(FlushReason::Coalesce);
            }
        }
        immediate.then_some(FlushReason::IdleBypass)
    }

    /// Milliseconds until the wait or coalesce timer fires (0 when one already has); `None` when empty.
    pub fn time_until_next_trigger_ms(&self, now: f64) -> Option<f64> {
        let first = self.first_request_time?;
        let a = (self.config.max_batch_wait_ms - ms_since(now, first)).max(0.0);
        let b = match self.last_submit_time {
            Some(last) => (self.config.effective_coalesce_ms() - ms_since(now, last)).max(0.0),
            None => self.config.coalesce_ms,
        };
        Some(a.min(b))
    }

    /// Take the batch for `reason` if a trigger fires (`immediate` allows the idle bypass).
    pub fn try_get_batch(&mut self, now: f64, immediate: bool) -> Option<Batch> {
        let reason = self.flush_reason(now, immediate)?;
        Some(self.extract(reason, usize::MAX))
    }

    /// A drain: up to `max_items` regardless of triggers, obeying the caps; `None` when empty.
    pub fn try_drain_up_to(&mut self, max_items: usize) -> Option<Batch> {
        if self.pending.is_empty() || max_items == 0 {
            return None;
        }
        Some(self.extract(FlushReason::Drain, max_items))
    }

    /// Runs-alone lane order (§3.5 `order_for_lanes`, newer than v0.7.1): batchable items by cost,
    /// then runs-alone items by arrival; while both lanes have work they take turns, and the very
    /// first batch comes from the lane of the oldest item.
    fn order_for_lanes(&mut self) {
        self.pending.sort_by(|a, b| {
            a.alone.cmp(&b.alone).then_with(|| {
                if a.alone {
                    a.arrival.total_cmp(&b.arrival)
                } else {
                    a.cost.cmp(&b.cost)
                }
            })
        });
        let Some(h) = self.pending.iter().position(|p| p.alone) else {
            return;
        };
        if h == 0 {
            return; // only runs-alone items pending
        }
        let alone_turn = match self.last_batch_alone {
            Some(last) => !last,
            None => {
                let oldest = self
                    .pending
                    .iter()
                    .min_by(|a, b| a.arrival.total_cmp(&b.arrival));
                oldest.is_some_and(|p| p.alone)
            }
        };
        if alone_turn {
            self.pending[..=h].rotate_right(1);
        }
    }

    /// Pack a batch (§3.5): stable cost sort (lane order when runs-alone items are pending), then
    /// take while under the caps, at least one item; a runs-alone item goes by itself.
    pub fn extract(&mut self, reason: FlushReason, max_items: usize) -> Batch {
        if self.alone_count > 0 {
            self.order_for_lanes();
        } else {
            self.pending.sort_by_key(|p| p.cost);
        }
        let cap = self.effective_max_cost();
        let nmax = self.config.max_batch_requests.max(1);
        let max_items = max_items.max(1);
        let (mut taken, mut batch_cost) = (0usize, 0u64);
        for p in &self.pending {
            if taken >= max_items {
                break;
            }
            if p.alone && taken > 0 {
                break; // never shares
            }
            if taken > 0 && batch_cost.saturating_add(p.cost) > cap {
                break;
            }
            batch_cost = batch_cost.saturating_add(p.cost);
            taken += 1;
            if p.alone || taken >= nmax {
                break;
            }
        }
        if taken > 0 {
            self.last_batch_alone = Some(self.pending[0].alone);
        }
        let gone_alone = self.pending[..taken].iter().filter(|p| p.alone).count();
        self.alone_count -= gone_alone;
        let ids = self.pending.drain(..taken).map(|p| p.id).collect();
        self.total_cost = self.total_cost.saturating_sub(batch_cost);
        if self.min_hard_cap.is_some() {
            self.recompute_min_hard_cap();
        }
        // Re-anchor both timers on what is left (the Rust sidecar's choice, §3.5 [DIV]).
        self.first_request_time = self.pending.iter().map(|p| p.arrival).reduce(f64::min);
        self.last_submit_time = self.pending.iter().map(|p| p.arrival).reduce(f64::max);
        Batch {
            ids,
            total_cost: batch_cost,
            reason,
        }
    }

    /// Remove everything (shutdown residue), oldest first.
    pub fn drain_all(&mut self) -> Vec<u64> {
        self.total_cost = 0;
        self.min_hard_cap = None;
        self.alone_count = 0;
        self.first_request_time = None;
        self.last_submit_time = None;
        let mut all = std::mem::take(&mut self.pending);
        all.sort_by(|a, b| a.arrival.total_cmp(&b.arrival));
        all.into_iter().map(|p| p.id).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn former() -> Batcher {
        Batcher::new(BatchConfig::default())
    }

    #[test]
    fn effective_coalesce_examples() {
        let mut c = BatchConfig::default();
        assert_eq!(c.effective_coalesce_ms(), 5.0);
        c.coalesce_ms = 15.0;
        c.max_batch_wait_ms = 4.0;
        assert_eq!(c.effective_coalesce_ms(), 2.0);
        c.coalesce_ms = 2.0;
        c.max_batch_wait_ms = 100.0;
        assert_eq!(c.effective_coalesce_ms(), 2.0);
    }

    #[test]
    fn triggers_in_order() {
        let mut b = former();
        assert_eq!(b.flush_reason(0.0, true), None);
        assert!(b.submit(1, 100, 0.0, None)); // first item wakes
        assert_eq!(b.flush_reason(0.0, false), None);
        assert_eq!(b.flush_reason(0.0, true), Some(FlushReason::IdleBypass));
        assert_eq!(b.flush_reason(0.005, false), Some(FlushReason::Coalesce));
        b.submit(2, 100, 0.004, None);
        assert_eq!(b.flush_reason(0.008, false), None);
        assert_eq!(b.flush_reason(0.015, false), Some(FlushReason::Timeout));
        for i in 3..=12 {
            b.submit(i, 1, 0.009, None);
        }
        assert_eq!(b.flush_reason(0.009, false), Some(FlushReason::CountCap));
        b.submit(13, 20000, 0.009, None);
        assert_eq!(b.flush_reason(0.009, false), Some(FlushReason::CostCap));
    }

    /// scheduler-and-prep vector 20 (newer than v0.7.1): clip 5 s (t0), long 240 s (t1), clip 8 s
    /// (t2) give [clips 5, 8], then [long].
    #[test]
    fn runs_alone_items_never_share_and_the_lanes_take_turns() {
        let mut b = Batcher::new(BatchConfig {
            max_batch_cost: 720_000,
            max_batch_requests: 12,
            ..BatchConfig::default()
        });
        b.submit_item(0, 5_000, 0.0, Some(720_000), false);
        b.submit_item(1, 240_000, 0.001, Some(720_000), true);
        b.submit_item(2, 8_000, 0.002, Some(720_000), false);
        let first = b.extract(FlushReason::Timeout, usize::MAX);
        assert_eq!(first.ids, vec![0, 2]);
        let second = b.extract(FlushReason::Timeout, usize::MAX);
        assert_eq!(second.ids, vec![1]);
        assert!(b.is_empty());
    }

    /// Vector 21: runs-alone items are served in arrival order whatever their size, one per batch;
    /// with a batchable item pending, the lanes alternate, the oldest item's lane first.
    #[test]
    fn runs_alone_items_go_in_arrival_order_alternating_with_the_batchable_lane() {
        let mut b = former();
        b.submit_item(10, 900, 0.0, None, true);
        b.submit_item(11, 100, 0.001, None, true);
        b.submit_item(12, 5, 0.002, None, false);
        b.submit_item(13, 7, 0.003, None, false);
        assert_eq!(b.extract(FlushReason::Timeout, usize::MAX).ids, vec![10]); // oldest is alone
        assert_eq!(
            b.extract(FlushReason::Timeout, usize::MAX).ids,
            vec![12, 13]
        );
        assert_eq!(b.extract(FlushReason::Timeout, usize::MAX).ids, vec![11]);
        assert!(b.is_empty());
        assert_eq!(b.alone_count, 0);
    }

    #[test]
    fn lone_oversize_item_goes_alone() {
        let mut b = former();
        b.submit(7, 50_000, 0.0, None);
        let batch = b.try_get_batch(0.0, false).unwrap();
        assert_eq!(
            (batch.ids, batch.reason),
            (vec![7], FlushReason::SingleOversize)
        );
        assert!(b.is_empty() && b.total_cost() == 0);
    }

    #[test]
    fn packing_is_cost_sorted_and_capped() {
        let mut b = Batcher::new(BatchConfig {
            max_batch_cost: 10,
            ..BatchConfig::default()
        });
        for (id, cost) in [(1, 6), (2, 3), (3, 3), (4, 20)] {
            b.submit(id, cost, 0.0, None);
        }
        let batch = b.extract(FlushReason::CostCap, usize::MAX);
        assert_eq!((batch.ids, batch.total_cost), (vec![2, 3], 6));
        let next = b.extract(FlushReason::Drain, usize::MAX);
        assert_eq!(next.ids, vec![1]);
        let last = b.extract(FlushReason::Drain, usize::MAX);
        assert_eq!(last.ids, vec![4]); // costlier than the cap: alone
        assert!(b.try_drain_up_to(5).is_none());
    }

    #[test]
    fn timers_reanchor_on_the_remainder() {
        let mut b = Batcher::new(BatchConfig {
            max_batch_requests: 1,
            ..BatchConfig::default()
        });
        b.submit(1, 1, 0.0, None);
        b.submit(2, 1, 0.010, None);
        b.extract(FlushReason::CountCap, usize::MAX);
        assert_eq!(b.time_until_next_trigger_ms(0.010), Some(5.0));
        assert_eq!(b.head_arrival(), Some(0.010));
    }

    #[test]
    fn hard_cap_lowers_the_whole_queue() {
        let mut b = former();
        b.submit(1, 100, 0.0, Some(150));
        b.submit(2, 100, 0.0, None);
        assert_eq!(b.effective_max_cost(), 150);
        assert_eq!(b.flush_reason(0.0, false), Some(FlushReason::CostCap));
        assert_eq!(b.extract(FlushReason::CostCap, usize::MAX).ids, vec![1]);
    }

    #[test]
    fn a_hard_cap_stops_applying_once_its_item_has_left() {
        let mut b = former();
        b.submit(1, 10, 0.0, Some(150));
        b.submit(2, 100, 0.0, Some(120));
        b.submit(3, 100, 0.0, None);
        assert_eq!(b.effective_max_cost(), 120);
        assert_eq!(b.extract(FlushReason::CostCap, 1).ids, vec![1]);
        assert_eq!(b.effective_max_cost(), 120); // item 2 is still pending
        assert_eq!(b.extract(FlushReason::CostCap, 1).ids, vec![2]);
        assert_eq!(b.effective_max_cost(), former().effective_max_cost());
        b.submit(4, 1, 0.0, Some(50));
        assert_eq!(b.drain_all(), vec![3, 4]);
        assert_eq!(b.effective_max_cost(), former().effective_max_cost());
    }
}
