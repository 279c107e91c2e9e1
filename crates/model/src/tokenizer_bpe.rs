//! Byte-level BPE merging: apply ranked merges to one pre-tokenized word, lowest rank first
//! and leftmost among equals (the order llama.cpp's priority queue produces).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

/// Merge table: (left id, right id) → (rank, merged id).
pub type MergeRanks = HashMap<(u32, u32), (u32, u32)>;

/// One live symbol in the word's linked list.
#[derive(Clone, Copy)]
struct Sym {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

/// Merges `ids` (initially one token per byte) in place and appends the result to `out`.
pub fn merge_word(ids: &[u32], ranks: &MergeRanks, out: &mut Vec<u32>) {
    if ids.len() < 2 {
        out.extend_from_slice(ids);
        return;
    }
    let mut syms: Vec<Sym> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| Sym {
            id,
            prev: i.checked_sub(1),
            next: (i + 1 < ids.len()).then_some(i + 1),
            alive: true,
        })
        .collect();
    // Heap of (rank, left index, left id, right id); stale entries are skipped on pop.
    let mut heap = BinaryHeap::new();
    let push = |heap: &mut BinaryHeap<_>, syms: &[Sym], l: usize| {
        if let Some(r) = syms[l].next {
            if let Some(&(rank, _)) = ranks.get(&(syms[l].id, syms[r].id)) {
                heap.push(Reverse((rank, l, syms[l].id, syms[r].id)));
            }
        }
    };
    for i in 0..syms.len() - 1 {
        push(&mut heap, &syms, i);
    }
    while let Some(Reverse((rank, l, lid, rid))) = heap.pop() {
        let Some(r) = syms[l].next else { continue };
        if !syms[l].alive || syms[l].id != lid || syms[r].id != rid {
            continue;
        }
        let Some(&(_, merged)) = ranks.get(&(lid, rid)).filter(|m| m.0 == rank) else {
            continue;
        };
        syms[l].id = merged;
        syms[r].alive = false;
        syms[l].next = syms[r].next;
        if let Some(n) = syms[r].next {
            syms[n].prev = Some(l);
        }
        if let Some(p) = syms[l].prev {
            push(&mut heap, &syms, p);
        }
        push(&mut heap, &syms, l);
    }
    let mut cur = Some(0);
    while let Some(i) = cur {
        out.push(syms[i].id);
        cur = syms[i].next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_rank_then_leftmost() {
        // ids: a=0 b=1 c=2; ab=3 (rank 1), bc=4 (rank 0), abc=5 from a+bc (rank 2)
        let mut r = MergeRanks::new();
        r.insert((0, 1), (1, 3));
        r.insert((1, 2), (0, 4));
        r.insert((0, 4), (2, 5));
        let mut out = Vec::new();
        merge_word(&[0, 1, 2], &r, &mut out);
        assert_eq!(out, [5]);
        out.clear();
        // "abab": ab merges leftmost first, both become ab.
        merge_word(&[0, 1, 0, 1], &r, &mut out);
        assert_eq!(out, [3, 3]);
        out.clear();
        merge_word(&[2], &r, &mut out);
        assert_eq!(out, [2]);
    }
}
