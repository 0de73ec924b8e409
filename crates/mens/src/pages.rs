//! The KV pool in pages: which fixed-size pages of the pool each slot's cache is made of, which
//! pages are free, which are shared. Pure bookkeeping (no device memory): a paged runner (the CUDA
//! batch) keeps one and moves rows as it says; the scheduler admits a request only when the pool
//! can give it every page it may need ([`PagePool::admit`]), so a step never runs out of pages.
//!
//! - A slot's table lists its pages in position order: position `p` lives in page
//!   `table[p / page]`, row `p % page`.
//! - A page may sit in several tables (a prompt prefix one slot holds, given to another by
//!   [`PagePool::share`]); a slot about to write into a shared page gets its own copy first
//!   ([`PagePool::prepare`] returns the copies to make).
//! - A busy slot (a request running) has a claim: the pages its request may hold at most. An idle
//!   slot keeps its pages as a cache for the next request of its tenant, until a busy slot needs
//!   them (least recently used first).

use crate::error::{Error, Result};

/// Page bookkeeping for `slots` caches over a pool of `pages` pages of `page` tokens.
#[derive(Debug, Clone)]
pub struct PagePool {
    page: usize,
    /// Per page: how many tables hold it (0: free).
    refs: Vec<u32>,
    free: Vec<u32>,
    tables: Vec<Vec<u32>>,
    /// Per slot: pages its running request may hold (0: idle).
    claim: Vec<usize>,
    /// Per slot: when it went idle (eviction takes the oldest first).
    idle_since: Vec<u64>,
    clock: u64,
}

/// What [`PagePool::prepare`] did besides extending the table: pages to copy (source, copy) before
/// the slot writes, and idle slots whose caches were taken (they now hold no tokens).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub copies: Vec<(u32, u32)>,
    pub evicted: Vec<usize>,
}

impl PagePool {
    pub fn new(pages: usize, page: usize, slots: usize) -> Result<Self> {
        if page == 0 || pages == 0 || pages > u32::MAX as usize || slots == 0 {
            return Err(Error::InvalidArgument(
                "a page pool needs pages of ≥ 1 token, ≥ 1 page and ≥ 1 slot".into(),
            ));
        }
        Ok(PagePool {
            page,
            refs: vec![0; pages],
            // Popped from the end: page 0 first.
            free: (0..pages as u32).rev().collect(),
            tables: vec![Vec::new(); slots],
            claim: vec![0; slots],
            idle_since: vec![0; slots],
            clock: 0,
        })
    }

    /// Tokens a page holds.
    pub fn page(&self) -> usize {
        self.page
    }

    /// Pages in the pool.
    pub fn pages(&self) -> usize {
        self.refs.len()
    }

    /// Pages held by some slot (busy or idle).
    pub fn used(&self) -> usize {
        self.pages() - self.free.len()
    }

    /// Pages that `tokens` tokens take.
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page)
    }

    pub fn table(&self, slot: usize) -> &[u32] {
        &self.tables[slot]
    }

    /// How many tables hold `page`.
    pub fn refs(&self, page: u32) -> u32 {
        self.refs[page as usize]
    }

    pub fn is_busy(&self, slot: usize) -> bool {
        self.claim[slot] > 0
    }

    /// Pages a busy slot may still take: its claim less what it holds.
    fn outstanding(&self) -> usize {
        (0..self.tables.len())
            .map(|s| self.claim[s].saturating_sub(self.tables[s].len()))
            .sum()
    }

    /// Pages held by idle slots only (freed if every idle cache were dropped).
    fn evictable(&self) -> usize {
        let mut busy = vec![false; self.pages()];
        for (s, t) in self.tables.iter().enumerate() {
            if self.claim[s] > 0 {
                for &p in t {
                    busy[p as usize] = true;
                }
            }
        }
        (0..self.pages())
            .filter(|&p| self.refs[p] > 0 && !busy[p])
            .count()
    }

    /// Pages a new claim could still take: free and evictable pages less what busy slots may
    /// still take.
    pub fn available(&self) -> usize {
        (self.free.len() + self.evictable()).saturating_sub(self.outstanding())
    }

    /// Pages a request of `tokens` tokens (prompt + most generated) claims: its pages, and one for
    /// a copy of a shared page it writes into.
    pub fn claim_for(&self, tokens: usize) -> usize {
        self.pages_for(tokens) + 1
    }

    /// Claim pages for `tokens` tokens on `slot` (a request starting there, or a busy one growing;
    /// what it holds now stays, counted in the claim) when the pool can give every page of it;
    /// false (nothing changed) when it cannot yet.
    pub fn admit(&mut self, slot: usize, tokens: usize) -> bool {
        let before = self.claim[slot];
        self.claim[slot] = self.claim_for(tokens);
        let fits = self.free.len() + self.evictable() >= self.outstanding();
        if !fits {
            self.claim[slot] = before;
        }
        fits
    }

    /// The slot's request ended (finished, failed or abandoned): its claim goes; its pages stay as
    /// an idle cache until a busy slot needs them.
    pub fn release(&mut self, slot: usize) {
        if self.claim[slot] > 0 {
            self.claim[slot] = 0;
            self.clock += 1;
            self.idle_since[slot] = self.clock;
        }
    }

    /// Keep the pages of the first `tokens` tokens of the slot; the rest go back (free when no
    /// other table holds them).
    pub fn truncate(&mut self, slot: usize, tokens: usize) {
        let keep = self.pages_for(tokens);
        while self.tables[slot].len() > keep {
            let p = self.tables[slot].pop().expect("len > keep");
            self.unref(p);
        }
    }

    fn unref(&mut self, p: u32) {
        let r = &mut self.refs[p as usize];
        *r -= 1;
        if *r == 0 {
            self.free.push(p);
        }
    }

    /// Make `dst` (holding nothing after this) hold the pages of the first `tokens` tokens of
    /// `src`, shared: no rows copied. A busy `src` may have to copy the last of them before
    /// writing into it (after stepping back into it): its claim grows by that page, and the share
    /// is refused when the pool has no page to spare for it.
    pub fn share(&mut self, src: usize, dst: usize, tokens: usize) -> Result<()> {
        let n = self.pages_for(tokens);
        if src == dst || n > self.tables[src].len() {
            return Err(Error::InvalidArgument(format!(
                "slot {src} holds no {tokens} tokens to share with slot {dst}"
            )));
        }
        self.truncate(dst, 0);
        if self.claim[src] > 0 {
            if self.available() == 0 {
                return Err(Error::Memory(
                    "no page to spare for sharing a busy slot's prefix".into(),
                ));
            }
            self.claim[src] += 1;
        }
        let pages = self.tables[src][..n].to_vec();
        for &p in &pages {
            self.refs[p as usize] += 1;
        }
        self.tables[dst] = pages;
        Ok(())
    }

    /// A free page, taking the least recently used idle cache's pages (not `slot`'s) while none is
    /// free.
    fn take(&mut self, slot: usize, evicted: &mut Vec<usize>) -> Result<u32> {
        loop {
            if let Some(p) = self.free.pop() {
                self.refs[p as usize] = 1;
                return Ok(p);
            }
            let victim = (0..self.tables.len())
                .filter(|&s| s != slot && self.claim[s] == 0 && !self.tables[s].is_empty())
                .min_by_key(|&s| self.idle_since[s]);
            let Some(v) = victim else {
                return Err(Error::Memory(format!(
                    "the KV pool's {} pages are all in use",
                    self.pages()
                )));
            };
            self.truncate(v, 0);
            if !evicted.contains(&v) {
                evicted.push(v);
            }
        }
    }

    /// Before the slot writes positions `from..to`: pages to cover `to` tokens, and a page of its
    /// own in place of each shared one the writes fall in (the copies to make, source first).
    pub fn prepare(&mut self, slot: usize, from: usize, to: usize) -> Result<Prepared> {
        let mut out = Prepared::default();
        if from >= to {
            return Ok(out);
        }
        let first = from / self.page;
        for i in first..self.pages_for(to).min(self.tables[slot].len()) {
            let p = self.tables[slot][i];
            if self.refs[p as usize] > 1 {
                let q = self.take(slot, &mut out.evicted)?;
                if self.refs[p as usize] == 1 {
                    // Taking q dropped the idle cache that shared p: p is this slot's alone now.
                    self.unref(q);
                    continue;
                }
                self.refs[p as usize] -= 1;
                self.tables[slot][i] = q;
                out.copies.push((p, q));
            }
        }
        while self.tables[slot].len() < self.pages_for(to) {
            let q = self.take(slot, &mut out.evicted)?;
            self.tables[slot].push(q);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every page is free or held, and each page's count is the number of tables holding it.
    fn consistent(p: &PagePool) {
        let mut refs = vec![0u32; p.pages()];
        for t in &p.tables {
            for &q in t {
                refs[q as usize] += 1;
            }
        }
        assert_eq!(refs, p.refs);
        for &f in &p.free {
            assert_eq!(p.refs[f as usize], 0);
        }
        assert_eq!(
            p.free.len(),
            refs.iter().filter(|&&r| r == 0).count(),
            "free list"
        );
    }

    #[test]
    fn a_slot_takes_pages_as_it_grows_and_returns_them() {
        let mut p = PagePool::new(8, 64, 2).unwrap();
        assert!(p.admit(0, 200));
        let r = p.prepare(0, 0, 100).unwrap();
        assert_eq!(r, Prepared::default());
        assert_eq!(p.table(0).len(), 2);
        p.prepare(0, 100, 129).unwrap();
        assert_eq!(p.table(0).len(), 3);
        assert_eq!(p.used(), 3);
        p.truncate(0, 64);
        assert_eq!(p.table(0).len(), 1);
        assert_eq!(p.used(), 1);
        consistent(&p);
    }

    #[test]
    fn admission_counts_what_busy_slots_may_still_take() {
        // 10 pages: a request of 8 pages claims 9; another of 1 page claims 2 and must wait.
        let mut p = PagePool::new(10, 16, 3).unwrap();
        assert!(p.admit(0, 8 * 16));
        assert_eq!(p.available(), 1);
        assert!(!p.admit(1, 16), "claims beyond the pool wait");
        assert!(!p.is_busy(1), "a refused claim changes nothing");
        // Many short requests fit the same pool once the long one is gone.
        p.prepare(0, 0, 8 * 16).unwrap();
        p.release(0);
        for s in 1..3 {
            assert!(p.admit(s, 16));
        }
        // The idle cache of slot 0 is taken as they grow.
        let r1 = p.prepare(1, 0, 16).unwrap();
        let r2 = p.prepare(2, 0, 16).unwrap();
        assert!(
            r1.evicted.is_empty() && r2.evicted.is_empty(),
            "two pages were free"
        );
        consistent(&p);
    }

    #[test]
    fn idle_caches_are_taken_oldest_first_when_pages_run_out() {
        let mut p = PagePool::new(4, 8, 3).unwrap();
        for s in 0..2 {
            assert!(p.admit(s, 16));
            p.prepare(s, 0, 16).unwrap();
            p.release(s);
        }
        assert_eq!(p.used(), 4);
        assert_eq!(p.available(), 4, "idle caches are evictable");
        assert!(p.admit(2, 24));
        let r = p.prepare(2, 0, 24).unwrap();
        assert_eq!(r.evicted, vec![0, 1], "slot 0 went idle first, then slot 1");
        // A cache goes whole (its tokens are a prefix: none can be kept without the pages
        // before): slot 1's second page returns to the free list.
        assert!(p.table(0).is_empty() && p.table(1).is_empty());
        assert_eq!(p.table(2).len(), 3);
        assert_eq!(p.used(), 3);
        consistent(&p);
    }

    #[test]
    fn a_shared_prefix_holds_the_same_pages_until_written() {
        let mut p = PagePool::new(16, 4, 2).unwrap();
        assert!(p.admit(0, 20));
        p.prepare(0, 0, 10).unwrap();
        // Slot 1 takes the first 10 tokens: three pages shared (the third half full).
        p.share(0, 1, 10).unwrap();
        assert_eq!(p.table(1), p.table(0));
        assert_eq!(p.used(), 3);
        assert!(p.admit(1, 20));
        // Slot 1 writes position 10 (in the shared third page): its own copy of that page only.
        let r = p.prepare(1, 10, 12).unwrap();
        assert_eq!(r.copies.len(), 1);
        assert_eq!(r.copies[0].0, p.table(0)[2]);
        assert_eq!(&p.table(1)[..2], &p.table(0)[..2]);
        assert_ne!(p.table(1)[2], p.table(0)[2]);
        // Slot 0 writes on in its own third page, which nobody else holds now: no copy.
        let r = p.prepare(0, 10, 12).unwrap();
        assert!(r.copies.is_empty());
        // Freed on finish: slot 0 gone, the shared pages stay for slot 1.
        p.release(0);
        p.truncate(0, 0);
        assert_eq!(p.used(), 3);
        for &q in p.table(1) {
            assert_eq!(p.refs(q), 1);
        }
        consistent(&p);
    }

    #[test]
    fn writing_into_a_shared_page_after_truncation_copies_it() {
        let mut p = PagePool::new(8, 4, 2).unwrap();
        assert!(p.admit(0, 16));
        p.prepare(0, 0, 8).unwrap();
        p.share(0, 1, 8).unwrap();
        // Slot 0 steps back to 5 tokens and writes again: page 1 is shared, so it gets a copy.
        p.truncate(0, 5);
        let r = p.prepare(0, 5, 8).unwrap();
        assert_eq!(r.copies.len(), 1);
        assert_ne!(p.table(0)[1], p.table(1)[1]);
        assert_eq!(p.table(0)[0], p.table(1)[0]);
        consistent(&p);
    }

    /// Random requests through admission, growth, sharing, truncation and release: the counts
    /// stay consistent, and a busy slot growing within its claim always gets its pages (the
    /// guarantee a step relies on), whatever idle caches and shared pages there are.
    #[test]
    fn admitted_requests_always_get_their_pages() {
        use rand::{Rng, SeedableRng};
        let mut r = rand::rngs::StdRng::seed_from_u64(7);
        for round in 0..1000 {
            let (slots, page) = (r.gen_range(1..6), r.gen_range(1..9));
            let pages = r.gen_range(2..40);
            let mut p = PagePool::new(pages, page, slots).unwrap();
            // Per busy slot: tokens held and most tokens its request may hold.
            let mut held = vec![0usize; slots];
            let mut most = vec![0usize; slots];
            for _ in 0..400 {
                let s = r.gen_range(0..slots);
                match r.gen_range(0..6) {
                    0 if !p.is_busy(s) => {
                        // A new request keeps some of the slot's cache (its tenant's prefix),
                        // or takes another slot's prefix.
                        let other = r.gen_range(0..slots);
                        if other != s && held[other] > 0 && r.gen_bool(0.5) {
                            let n = r.gen_range(1..=held[other]);
                            // Refused when a busy source's possible copy finds no page.
                            held[s] = match p.share(other, s, n) {
                                Ok(()) => n,
                                Err(_) => 0,
                            };
                        } else {
                            held[s] = r.gen_range(0..=held[s]);
                            p.truncate(s, held[s]);
                        }
                        let want = held[s] + r.gen_range(1..3 * page + 2);
                        if want <= (pages - 1) * page && p.admit(s, want) {
                            most[s] = want;
                        }
                    }
                    1 | 2 if p.is_busy(s) && held[s] < most[s] => {
                        let to = (held[s] + r.gen_range(1..=page)).min(most[s]);
                        let prep = p
                            .prepare(s, held[s], to)
                            .unwrap_or_else(|e| panic!("round {round}: {e}"));
                        for v in prep.evicted {
                            assert!(!p.is_busy(v));
                            held[v] = 0;
                        }
                        held[s] = to;
                    }
                    3 if p.is_busy(s) => {
                        // A rejected proposal: back a few tokens.
                        held[s] -= r.gen_range(0..=held[s].min(3));
                        p.truncate(s, held[s]);
                    }
                    4 if p.is_busy(s) => p.release(s),
                    _ => {}
                }
                consistent(&p);
                for (t, &h) in held.iter().enumerate() {
                    assert!(p.table(t).len() >= p.pages_for(h), "slot {t} lost pages");
                }
            }
        }
    }

    #[test]
    fn an_empty_pool_is_an_error_not_a_panic() {
        let mut p = PagePool::new(2, 4, 2).unwrap();
        // Writes beyond a claim (a runner used without admission) fail cleanly.
        let e = p.prepare(0, 0, 12).unwrap_err();
        assert!(e.to_string().contains("pages are all in use"), "{e}");
        assert!(PagePool::new(0, 4, 1).is_err());
        assert!(p.share(0, 1, 100).is_err());
    }
}
