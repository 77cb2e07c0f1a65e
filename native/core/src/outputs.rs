//! Output framing inside `result_msgpack` (wire-protocol §11): msgpack-numpy sentinels and the
//! dense, sparse, multivector and score shapes, byte-identical to the v0.7.1 producers.
//!
//! Every function is generic over [`Out`], so callers can measure the exact size with a
//! [`crate::msgpack::Counter`] and then write straight into the final buffer: the element data is
//! copied exactly once.

use std::fmt;

use crate::msgpack::{self as mp, Out};

/// Output framing refused its input (→ `raw_output_shape_error`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShapeError(pub String);

impl fmt::Display for ShapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ShapeError {}

fn shape_error<T>(message: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(message.into()))
}

/// Element data of a sentinel: raw little-endian bytes, or values computed on the fly.
pub enum Data<'a> {
    Raw(&'a [u8]),
    /// float32 values divided by a norm (L2 normalisation) — written as f32 LE.
    DividedF32(&'a [u8], f32),
    /// float32 values rounded to float16 (round to nearest, ties to even) — written as f16 LE.
    F32ToF16(&'a [u8]),
}

impl Data<'_> {
    fn len(&self) -> usize {
        match self {
            Data::Raw(b) | Data::DividedF32(b, _) => b.len(),
            Data::F32ToF16(b) => b.len() / 2,
        }
    }
}

fn write_data(out: &mut impl Out, data: &Data<'_>) {
    match data {
        Data::Raw(bytes) => out.extend_from_slice(bytes),
        Data::DividedF32(bytes, norm) => {
            for chunk in bytes.chunks_exact(4) {
                let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]) / norm;
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        Data::F32ToF16(bytes) => {
            for chunk in bytes.chunks_exact(4) {
                let v = f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                out.extend_from_slice(&f32_to_f16_bits(v).to_le_bytes());
            }
        }
    }
}

/// msgpack-numpy ndarray sentinel: bin keys nd, type, kind, shape, data.
pub fn write_sentinel(out: &mut impl Out, type_code: &str, shape: &[u64], data: &Data<'_>) {
    write_sentinel_header(out, type_code, shape, data.len());
    write_data(out, data);
}

/// The sentinel up to and including the `data` bin header.
pub fn write_sentinel_header(out: &mut impl Out, type_code: &str, shape: &[u64], data_len: usize) {
    mp::write_map_header(out, 5);
    mp::write_bin(out, b"nd");
    mp::write_bool(out, true);
    mp::write_bin(out, b"type");
    mp::write_str(out, type_code);
    mp::write_bin(out, b"kind");
    mp::write_bin(out, b"");
    mp::write_bin(out, b"shape");
    mp::write_array_header(out, shape.len());
    for &d in shape {
        mp::write_uint(out, d);
    }
    mp::write_bin(out, b"data");
    mp::write_bin_header(out, data_len);
}

fn write_outer(out: &mut impl Out, item_id: Option<&str>, key: &str) {
    mp::write_map_header(out, if item_id.is_some() { 2 } else { 1 });
    if let Some(id) = item_id {
        mp::write_str(out, "id");
        mp::write_str(out, id);
    }
    mp::write_str(out, key);
}

/// L2 norm of float32 LE bytes: squares summed in f64 (so tiny and huge vectors survive), then
/// rounded to f32. `None` for a zero, NaN or infinite norm: such vectors are left as they are.
pub fn l2_norm(values: &[u8]) -> Option<f32> {
    let sum: f64 = values
        .chunks_exact(4)
        .map(|c| {
            let v = f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
            v * v
        })
        .sum();
    let norm = sum.sqrt() as f32;
    (norm > 0.0 && norm.is_finite()).then_some(norm)
}

/// Everything of a dense result before its element bytes (so a batch can reuse one header).
pub fn write_dense_header(out: &mut impl Out, count: u64, item_id: Option<&str>) {
    write_outer(out, item_id, "dense");
    mp::write_map_header(out, 3);
    mp::write_str(out, "dims");
    mp::write_uint(out, count);
    mp::write_str(out, "dtype");
    mp::write_str(out, "float32");
    mp::write_str(out, "values");
    write_sentinel_header(out, "<f4", &[count], count as usize * 4);
}

/// Dense element bytes: the values as they are, or divided by their L2 norm.
pub fn write_dense_values(out: &mut impl Out, values_f32: &[u8], normalize: bool) {
    let data = match normalize.then(|| l2_norm(values_f32)).flatten() {
        Some(norm) => Data::DividedF32(values_f32, norm),
        None => Data::Raw(values_f32),
    };
    write_data(out, &data);
}

/// Dense float32 result: `{id?, dense: {dims, dtype, values}}`.
pub fn frame_dense(
    out: &mut impl Out,
    values_f32: &[u8],
    dims: Option<u64>,
    item_id: Option<&str>,
    normalize: bool,
) -> Result<(), ShapeError> {
    if !values_f32.len().is_multiple_of(4) {
        return shape_error("dense values are not float32");
    }
    let count = (values_f32.len() / 4) as u64;
    let dims = dims.unwrap_or(count);
    if dims != count {
        return shape_error(format!("dense dims mismatch: dims {dims}, {count} values"));
    }
    write_dense_header(out, count, item_id);
    write_dense_values(out, values_f32, normalize);
    Ok(())
}

/// Sparse result: `{id?, sparse: {dims, dtype, indices, values}}` with int32 indices.
pub fn frame_sparse(
    out: &mut impl Out,
    indices_i32: &[u8],
    values_f32: &[u8],
    dims: Option<u64>,
    item_id: Option<&str>,
) -> Result<(), ShapeError> {
    if !indices_i32.len().is_multiple_of(4) || !values_f32.len().is_multiple_of(4) {
        return shape_error("sparse indices must be int32 and values float32");
    }
    if indices_i32.len() != values_f32.len() {
        return shape_error(format!(
            "sparse length mismatch: {} indices, {} values",
            indices_i32.len() / 4,
            values_f32.len() / 4
        ));
    }
    let n = (indices_i32.len() / 4) as u64;
    write_outer(out, item_id, "sparse");
    mp::write_map_header(out, 4);
    mp::write_str(out, "dims");
    mp::write_opt_uint(out, dims);
    mp::write_str(out, "dtype");
    mp::write_str(out, "float32");
    mp::write_str(out, "indices");
    write_sentinel(out, "<i4", &[n], &Data::Raw(indices_i32));
    mp::write_str(out, "values");
    write_sentinel(out, "<f4", &[n], &Data::Raw(values_f32));
    Ok(())
}

/// Source of multivector element data.
pub enum MultivectorValues<'a> {
    F32(&'a [u8]),
    /// Pre-rounded little-endian halves.
    F16(&'a [u8]),
}

/// Multivector result: `{id?, multivector: {token_dims, num_tokens, dtype, values}}`.
pub fn frame_multivector(
    out: &mut impl Out,
    values: MultivectorValues<'_>,
    num_tokens: u64,
    token_dims: u64,
    dtype: &str,
    item_id: Option<&str>,
) -> Result<(), ShapeError> {
    let elements = num_tokens
        .checked_mul(token_dims)
        .ok_or_else(|| ShapeError("multivector shape overflows".into()))?;
    let (type_code, data) = match (dtype, values) {
        ("float32", MultivectorValues::F32(b)) => {
            if b.len() as u64 != elements.saturating_mul(4) {
                return shape_error(format!(
                    "multivector has {} float32 values, expected {num_tokens} x {token_dims}",
                    b.len() / 4
                ));
            }
            ("<f4", Data::Raw(b))
        }
        ("float16", MultivectorValues::F32(b)) => {
            if b.len() as u64 != elements.saturating_mul(4) {
                return shape_error(format!(
                    "multivector has {} float32 values, expected {num_tokens} x {token_dims}",
                    b.len() / 4
                ));
            }
            ("<f2", Data::F32ToF16(b))
        }
        ("float16", MultivectorValues::F16(b)) => {
            if b.len() as u64 != elements.saturating_mul(2) {
                return shape_error(format!(
                    "multivector float16 data is {} bytes, expected {num_tokens} x {token_dims} x 2",
                    b.len()
                ));
            }
            ("<f2", Data::Raw(b))
        }
        (other, MultivectorValues::F16(_)) => {
            return shape_error(format!(
                "pre-encoded float16 multivector declared dtype {other:?}"
            ))
        }
        (other, _) => return shape_error(format!("unsupported multivector dtype {other:?}")),
    };
    write_outer(out, item_id, "multivector");
    mp::write_map_header(out, 4);
    mp::write_str(out, "token_dims");
    mp::write_uint(out, token_dims);
    mp::write_str(out, "num_tokens");
    mp::write_uint(out, num_tokens);
    mp::write_str(out, "dtype");
    mp::write_str(out, dtype);
    mp::write_str(out, "values");
    write_sentinel(out, type_code, &[num_tokens, token_dims], &data);
    Ok(())
}

/// Indices of `scores` sorted by score descending; stable, NaN compares equal to everything.
pub fn score_order(scores: &[f32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    order.sort_by(|&a, &b| {
        scores[b]
            .partial_cmp(&scores[a])
            .unwrap_or(std::cmp::Ordering::Equal)
    });
    order
}

/// Score result: a top-level array of `{item_id, score (f64 widened), rank}`.
pub fn frame_score(
    out: &mut impl Out,
    scores: &[f32],
    item_ids: &[&str],
) -> Result<(), ShapeError> {
    if scores.len() != item_ids.len() {
        return shape_error(format!(
            "score length mismatch: {} scores, {} item ids",
            scores.len(),
            item_ids.len()
        ));
    }
    mp::write_array_header(out, scores.len());
    for (rank, i) in score_order(scores).into_iter().enumerate() {
        mp::write_map_header(out, 3);
        mp::write_str(out, "item_id");
        mp::write_str(out, item_ids[i]);
        mp::write_str(out, "score");
        mp::write_f64(out, f64::from(scores[i]));
        mp::write_str(out, "rank");
        mp::write_uint(out, rank as u64);
    }
    Ok(())
}

/// IEEE 754 binary32 → binary16, round to nearest, ties to even (matches numpy's astype).
pub fn f32_to_f16_bits(value: f32) -> u16 {
    let x = value.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let mant = x & 0x007f_ffff;
    if exp == 0xff {
        // Inf or NaN (keep a quiet NaN with the top mantissa bits).
        if mant == 0 {
            return sign | 0x7c00;
        }
        let m = (mant >> 13) as u16;
        return sign | 0x7c00 | if m == 0 { 0x0200 } else { m | 0x0200 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00; // overflow → inf
    }
    if e <= 0 {
        // Subnormal half (or zero).
        if e < -10 {
            return sign;
        }
        let m = mant | 0x0080_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rem = m & ((1u32 << shift) - 1);
        let mut h = m >> shift;
        if rem > half || (rem == half && (h & 1) == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (mant >> 13);
    let rem = mant & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && (h & 1) == 1) {
        h += 1; // may carry into the exponent, which is still correct (up to inf)
    }
    sign | h as u16
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::unhex;

    fn f32s(values: &[f32]) -> Vec<u8> {
        values.iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    #[test]
    fn tv_f4_dense() {
        let mut out = Vec::new();
        frame_dense(&mut out, &f32s(&[1.0, 2.0, 3.0]), Some(3), None, false).unwrap();
        assert_eq!(out, unhex("81a564656e736583a464696d7303a56474797065a7666c6f61743332a676616c75657385c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659103c40464617461c40c0000803f0000004000004040"));
    }

    #[test]
    fn dense_counter_matches_writer() {
        let values = f32s(&[0.5; 1024]);
        let mut counter = mp::Counter::default();
        frame_dense(&mut counter, &values, None, Some("doc-1"), true).unwrap();
        let mut buf = vec![0u8; counter.0];
        let mut w = mp::SliceWriter::new(&mut buf);
        frame_dense(&mut w, &values, None, Some("doc-1"), true).unwrap();
        assert_eq!(w.written(), counter.0);
        let mut v = Vec::new();
        frame_dense(&mut v, &values, None, Some("doc-1"), true).unwrap();
        assert_eq!(v, buf);
    }

    #[test]
    fn dense_dims_mismatch() {
        assert!(frame_dense(&mut Vec::new(), &f32s(&[1.0]), Some(2), None, false).is_err());
    }

    #[test]
    fn tv_f6_sparse() {
        let idx: Vec<u8> = [3i32, 7, 42].iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut out = Vec::new();
        frame_sparse(&mut out, &idx, &f32s(&[0.5, 1.5, 2.5]), None, None).unwrap();
        assert_eq!(out, unhex("81a673706172736584a464696d73c0a56474797065a7666c6f61743332a7696e646963657385c4026e64c3c40474797065a33c6934c4046b696e64c400c40573686170659103c40464617461c40c03000000070000002a000000a676616c75657385c4026e64c3c40474797065a33c6634c4046b696e64c400c40573686170659103c40464617461c40c0000003f0000c03f00002040"));
    }

    #[test]
    fn tv_f10_multivector_f16_both_paths() {
        let expected = unhex("81ab6d756c7469766563746f7284aa746f6b656e5f64696d7302aa6e756d5f746f6b656e7302a56474797065a7666c6f61743136a676616c75657385c4026e64c3c40474797065a33c6632c4046b696e64c400c4057368617065920202c40464617461c408003c00c000430000");
        let mut a = Vec::new();
        frame_multivector(
            &mut a,
            MultivectorValues::F32(&f32s(&[1.0, -2.0, 3.5, 0.0])),
            2,
            2,
            "float16",
            None,
        )
        .unwrap();
        let mut b = Vec::new();
        frame_multivector(
            &mut b,
            MultivectorValues::F16(&unhex("003c00c000430000")),
            2,
            2,
            "float16",
            None,
        )
        .unwrap();
        assert_eq!(a, expected);
        assert_eq!(b, expected);
        assert!(frame_multivector(
            &mut Vec::new(),
            MultivectorValues::F16(&[0, 0]),
            1,
            1,
            "float32",
            None
        )
        .is_err());
    }

    #[test]
    fn tv_f12_score_sorted_and_widened() {
        let expected = unhex("9283a76974656d5f6964a161a573636f7265cb3fecccccc0000000a472616e6b0083a76974656d5f6964a162a573636f7265cb3fe0000000000000a472616e6b01");
        let mut a = Vec::new();
        frame_score(&mut a, &[0.9, 0.5], &["a", "b"]).unwrap();
        let mut b = Vec::new();
        frame_score(&mut b, &[0.5, 0.9], &["b", "a"]).unwrap();
        assert_eq!(a, expected);
        assert_eq!(b, expected);
    }

    #[test]
    fn tv_f15_rounding() {
        assert_eq!(f32_to_f16_bits(1.0), 0x3c00);
        assert_eq!(f32_to_f16_bits(-2.0), 0xc000);
        assert_eq!(f32_to_f16_bits(1.000_488_3), 0x3c00);
        assert_eq!(f32_to_f16_bits(1.001_464_8), 0x3c02);
        assert_eq!(f32_to_f16_bits(65520.0), 0x7c00);
        assert_eq!(f32_to_f16_bits(f32::INFINITY), 0x7c00);
        assert_eq!(f32_to_f16_bits(5.960_464_5e-8), 0x0001);
        assert_eq!(f32_to_f16_bits(2.980_232_2e-8), 0x0000); // tie to even (0)
        assert_eq!(f32_to_f16_bits(-0.0), 0x8000);
        assert!(
            f32_to_f16_bits(f32::NAN) & 0x7c00 == 0x7c00 && f32_to_f16_bits(f32::NAN) & 0x3ff != 0
        );
    }
}
