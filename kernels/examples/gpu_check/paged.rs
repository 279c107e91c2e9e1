//! Paged attention (with the generation check), page checksums, zeroing and guard words.

use anyhow::{ensure, Result};
use half::f16;
use pagewarden_kernels::cuda::{fmix64, pwsum64, AttentionBatch, CudaBackend, PageShape};
use pagewarden_kernels::{paged_attention, AttnGeometry, KvBlock, Parallel};

use crate::report::{compare, verdict, Row};
use crate::Rng;

/// SmolLM2-135M's attention shape, 2 layers, 16-token pages.
const SHAPE: PageShape = PageShape {
    layers: 2,
    kv_heads: 3,
    head_dim: 64,
    page_size: 16,
};
const HEADS: usize = 9;
const PAGES: usize = 96;
const LAYER: usize = 1;
/// Written into `out` before a launch; a refused sequence must still hold it afterwards.
const SENTINEL: f32 = 7777.0;

struct Setup {
    host: Vec<f16>,
    gens: Vec<u64>,
    /// Per sequence: its (page, generation) table.
    tables: Vec<Vec<(u32, u64)>>,
    lens: Vec<usize>,
}

fn setup(rng: &mut Rng) -> Setup {
    let host: Vec<f16> = (0..PAGES * SHAPE.page_elems())
        .map(|_| f16::from_f32(rng.unit()))
        .collect();
    let gens: Vec<u64> = (0..PAGES).map(|_| rng.next_u64() >> 1).collect();
    // Pages handed out in a shuffled order so tables are not contiguous.
    let mut order: Vec<u32> = (0..PAGES as u32).collect();
    for i in (1..order.len()).rev() {
        order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
    }
    let lens = vec![1, 17, 100, 700];
    let mut next = 0;
    let tables = lens
        .iter()
        .map(|&len: &usize| {
            let n = len.div_ceil(SHAPE.page_size);
            let t: Vec<(u32, u64)> = order[next..next + n]
                .iter()
                .map(|&p| (p, gens[p as usize]))
                .collect();
            next += n;
            t
        })
        .collect();
    Setup {
        host,
        gens,
        tables,
        lens,
    }
}

/// CPU attention for one query row of sequence `seq` at `pos` (over the last `window` keys
/// with a window).
fn cpu_row(
    s: &Setup,
    seq: usize,
    pos: usize,
    q: &[f32],
    window: Option<usize>,
    par: &Parallel,
) -> Vec<f32> {
    let geo = AttnGeometry {
        heads: HEADS,
        kv_heads: SHAPE.kv_heads,
        head_dim: SHAPE.head_dim,
        page_size: SHAPE.page_size,
        window,
        score_scale: None,
    };
    let be = SHAPE.page_size * SHAPE.token_width();
    let blocks: Vec<KvBlock<'_>> = s.tables[seq]
        .iter()
        .map(|&(p, _)| {
            let base = p as usize * SHAPE.page_elems();
            KvBlock {
                k: &s.host[base + SHAPE.block_offset(LAYER, 0)..][..be],
                v: &s.host[base + SHAPE.block_offset(LAYER, 1)..][..be],
            }
        })
        .collect();
    let mut out = vec![0f32; HEADS * SHAPE.head_dim];
    paged_attention(&geo, q, 1, pos, &blocks, &mut out, par);
    out
}

pub fn attention(
    gpu: &CudaBackend,
    par: &Parallel,
    rng: &mut Rng,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let s = setup(rng);
    let mut pool = gpu.kv_pool(SHAPE, PAGES)?;
    gpu.write(&mut pool.data, &s.host)?;
    gpu.write(&mut pool.generations, &s.gens)?;
    let width = HEADS * SHAPE.head_dim;

    // Decode rows (last position of each sequence) plus a prefill chunk of sequence 2.
    let mut queries: Vec<(u32, u32)> = s
        .lens
        .iter()
        .enumerate()
        .map(|(i, &l)| (i as u32, l as u32 - 1))
        .collect();
    queries.extend((40..56).map(|p| (2u32, p)));
    let q = rng.vec(queries.len() * width, 1.0);
    let tables: Vec<&[(u32, u64)]> = s.tables.iter().map(|t| t.as_slice()).collect();
    // Every earlier key, then a sliding window (Gemma 3's local layers).
    for window in [None, Some(40)] {
        let batch = AttentionBatch {
            heads: HEADS,
            layer: LAYER,
            tables: &tables,
            queries: &queries,
            window,
            scale: None,
        };
        let dq = gpu.upload(&q)?;
        let mut dout = gpu.upload(&vec![SENTINEL; q.len()])?;
        let mut flags = gpu.zeros::<u32>(tables.len())?;
        gpu.paged_attention(&pool, &batch, &dq, &mut dout, &mut flags)?;
        let got = gpu.download(&dout)?;
        let faults = gpu.read_faults(&flags)?;
        let mut want = Vec::with_capacity(q.len());
        for (i, &(seq, pos)) in queries.iter().enumerate() {
            let qi = &q[i * width..][..width];
            want.extend(cpu_row(&s, seq as usize, pos as usize, qi, window, par));
        }
        let shape = format!(
            "{} q, ctx<=700, window {window:?}, 9h/3kv x64",
            queries.len()
        );
        // Both sides round q and the probabilities to f16; a probability whose CPU and GPU f32
        // values straddle an f16 rounding boundary differs by one f16 ulp (2^-11 relative).
        let mut row = compare("paged_attention", shape, &got, &want, 1e-3);
        if faults.iter().any(|f| f.is_some()) {
            row.pass = false;
            row.note = format!("unexpected faults {faults:?}");
        }
        rows.push(row);
    }

    // Faults: seq 0 asks past its table, seq 2 presents a stale generation (its page was
    // reallocated), seq 3 names a page beyond the pool; seq 1 is healthy and must still match.
    let bumped = s.tables[2][3].0;
    gpu.set_generations(&mut pool, &[bumped], &[s.gens[bumped as usize] + 1])?;
    let mut t3 = s.tables[3].clone();
    t3[5].0 = PAGES as u32 + 7;
    let tables: Vec<&[(u32, u64)]> = vec![&s.tables[0], &s.tables[1], &s.tables[2], &t3];
    let queries: Vec<(u32, u32)> = vec![(0, 16), (1, 16), (2, 99), (2, 10), (3, 699)];
    let q = rng.vec(queries.len() * width, 1.0);
    let batch = AttentionBatch {
        heads: HEADS,
        layer: LAYER,
        tables: &tables,
        queries: &queries,
        window: None,
        scale: None,
    };
    let dq = gpu.upload(&q)?;
    let mut dout = gpu.upload(&vec![SENTINEL; q.len()])?;
    let mut flags = gpu.zeros::<u32>(tables.len())?;
    gpu.paged_attention(&pool, &batch, &dq, &mut dout, &mut flags)?;
    let got = gpu.download(&dout)?;
    let faults = gpu.read_faults(&flags)?;
    let untouched = |qi: usize| {
        got[qi * width..(qi + 1) * width]
            .iter()
            .all(|&v| v == SENTINEL)
    };
    let healthy = cpu_row(&s, 1, 16, &q[width..2 * width], None, par);
    let healthy_ok = compare("", String::new(), &got[width..2 * width], &healthy, 1e-4).pass;
    let checks = [
        (
            "seq0 short table flagged",
            faults[0].is_some_and(|f| f.short_table()),
        ),
        ("seq1 healthy", faults[1].is_none() && healthy_ok),
        (
            "seq2 stale generation flagged",
            faults[2].is_some_and(|f| f.generation_mismatch()),
        ),
        (
            "seq3 bad page flagged",
            faults[3].is_some_and(|f| f.bad_page()),
        ),
        (
            "failed rows untouched",
            untouched(0) && untouched(2) && untouched(3) && untouched(4),
        ),
    ];
    let failed: Vec<&str> = checks.iter().filter(|c| !c.1).map(|c| c.0).collect();
    rows.push(verdict(
        "attention generation check",
        "stale gen / bad page / short".into(),
        failed.is_empty(),
        if failed.is_empty() {
            format!(
                "faults {:?}",
                faults.iter().map(|f| f.map(|f| f.0)).collect::<Vec<_>>()
            )
        } else {
            format!("FAILED: {}", failed.join("; "))
        },
    ));
    gpu.write(&mut pool.generations, &s.gens)?;
    pages(gpu, &mut pool, &s.host, rows)
}

fn page_bytes(host: &[f16], p: usize) -> Vec<u8> {
    host[p * SHAPE.page_elems()..(p + 1) * SHAPE.page_elems()]
        .iter()
        .flat_map(|h| h.to_le_bytes())
        .collect()
}

fn pages(
    gpu: &CudaBackend,
    pool: &mut pagewarden_kernels::cuda::DeviceKvPool,
    host: &[f16],
    rows: &mut Vec<Row>,
) -> Result<()> {
    let shape = format!("{} B/page", SHAPE.page_bytes());
    // Checksums against the CPU twin.
    let ids: Vec<u32> = vec![0, 1, 17, 50, 95];
    let got = gpu.page_checksums(pool, &ids)?;
    let want: Vec<u64> = ids
        .iter()
        .map(|&p| pwsum64(&page_bytes(host, p as usize)))
        .collect();
    rows.push(verdict(
        "page_checksum (PWSUM64)",
        shape.clone(),
        got == want,
        String::new(),
    ));

    // Zeroing: listed pages become zero, the others keep their bytes.
    let zero_ids = [3u32, 40, 95];
    gpu.zero_pages(pool, &zero_ids)?;
    let after = gpu.download(&pool.data)?;
    let pe = SHAPE.page_elems();
    let ok = (0..PAGES).all(|p| {
        let (a, b) = (&after[p * pe..(p + 1) * pe], &host[p * pe..(p + 1) * pe]);
        if zero_ids.contains(&(p as u32)) {
            a.iter().all(|v| v.to_bits() == 0)
        } else {
            a == b
        }
    });
    rows.push(verdict("page_zero", shape.clone(), ok, String::new()));
    let zsum = gpu.page_checksums(pool, &[3])?;
    ensure!(
        zsum[0] == pwsum64(&vec![0u8; SHAPE.page_bytes()]),
        "checksum of a zeroed page"
    );

    // Guard words: stamp, check clean, corrupt one, check it alone is caught.
    let ids: Vec<u32> = (0..20).collect();
    let vals: Vec<u64> = ids.iter().map(|&p| fmix64(p as u64 ^ 0xfeed)).collect();
    gpu.stamp_guards(pool, &ids, &vals)?;
    let clean = gpu.check_guards(pool, &ids, &vals)?;
    gpu.stamp_guards(pool, &[5], &[0xdead_beef])?;
    let bad = gpu.check_guards(pool, &ids, &vals)?;
    let ok = clean.iter().all(|b| !b) && bad.iter().enumerate().all(|(i, &b)| b == (i == 5));
    rows.push(verdict(
        "guard_stamp / guard_check",
        "20 pages, 1 corrupted".into(),
        ok,
        String::new(),
    ));

    // Page staging copies (the transfer engine's device <-> host step).
    let pe = SHAPE.page_elems();
    let fresh: Vec<f16> = (0..pe)
        .map(|i| f16::from_f32((i % 97) as f32 / 8.0))
        .collect();
    gpu.write_page(pool, 7, &fresh)?;
    let ok = gpu.read_page(pool, 7)? == fresh && gpu.read_page(pool, 8)? == host[8 * pe..9 * pe];
    rows.push(verdict("read_page / write_page", shape, ok, String::new()));
    Ok(())
}
