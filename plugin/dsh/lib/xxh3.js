/**
 * XXH3-64 (seed 0, default secret) in plain JavaScript.
 *
 * The control socket's path is a pure function of the store and the workspace
 * (`docs/architecture.md`); the daemon computes it with the xxhash library, so
 * the plugin must produce the same 64-bit digest with no native dependency and
 * no build step.  BigInt keeps the 64-bit arithmetic exact; inputs are short
 * (two paths), so speed does not matter.  Checked against the reference
 * implementation's digests in `tests/e2e/socket_path_vectors.json` for every
 * length class (0, 1-3, 4-8, 9-16, 17-128, 129-240, long).
 * @module rewindfs-dsh/xxh3
 */

const M64 = (1n << 64n) - 1n;
const P32_1 = 0x9E3779B1n;
const P32_2 = 0x85EBCA77n;
const P32_3 = 0xC2B2AE3Dn;
const P64_1 = 0x9E3779B185EBCA87n;
const P64_2 = 0xC2B2AE3D27D4EB4Fn;
const P64_3 = 0x165667B19E3779F9n;
const P64_4 = 0x85EBCA77C2B2AE63n;
const P64_5 = 0x27D4EB2F165667C5n;
const PMX1 = 0x165667919E3779F9n;
const PMX2 = 0x9FB21C651E98DF25n;

const SECRET = Uint8Array.from(Buffer.from(
  'b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f' +
  'cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c' +
  '3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8' +
  'a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364' +
  'eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e' +
  '2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e', 'hex'));

const r32 = (b, o) => BigInt(b[o] | (b[o + 1] << 8) | (b[o + 2] << 16)) + (BigInt(b[o + 3]) << 24n);
const r64 = (b, o) => r32(b, o) | (r32(b, o + 4) << 32n);
const mul = (a, b) => (a * b) & M64;
const rotl = (x, r) => ((x << BigInt(r)) | (x >> BigInt(64 - r))) & M64;
const swap64 = (x) => {
  let y = 0n;
  for (let i = 0; i < 8; i++) y = (y << 8n) | ((x >> BigInt(8 * i)) & 0xFFn);
  return y;
};
const fold = (a, b) => {
  const p = a * b;
  return (p & M64) ^ (p >> 64n);
};

function xxh64Avalanche(h) {
  h ^= h >> 33n; h = mul(h, P64_2);
  h ^= h >> 29n; h = mul(h, P64_3);
  return h ^ (h >> 32n);
}

function avalanche(h) {
  h ^= h >> 37n; h = mul(h, PMX1);
  return h ^ (h >> 32n);
}

function rrmxmx(h, len) {
  h ^= rotl(h, 49) ^ rotl(h, 24);
  h = mul(h, PMX2);
  h ^= (h >> 35n) + BigInt(len);
  h = mul(h, PMX2);
  return h ^ (h >> 28n);
}

const mix16 = (b, o, so) => fold(b === null ? 0n : r64(b, o) ^ r64(SECRET, so), r64(b, o + 8) ^ r64(SECRET, so + 8));

function short(b) {
  const len = b.length;
  if (len === 0) return xxh64Avalanche(r64(SECRET, 56) ^ r64(SECRET, 64));
  if (len <= 3) {
    const combined = (BigInt(b[0]) << 16n) | (BigInt(b[len >> 1]) << 24n) | BigInt(b[len - 1]) | (BigInt(len) << 8n);
    return xxh64Avalanche(combined ^ (r32(SECRET, 0) ^ r32(SECRET, 4)));
  }
  if (len <= 8) {
    const input = (r32(b, len - 4) + (r32(b, 0) << 32n)) & M64;
    return rrmxmx(input ^ (r64(SECRET, 8) ^ r64(SECRET, 16)), len);
  }
  const lo = r64(b, 0) ^ (r64(SECRET, 24) ^ r64(SECRET, 32));
  const hi = r64(b, len - 8) ^ (r64(SECRET, 40) ^ r64(SECRET, 48));
  return avalanche((BigInt(len) + swap64(lo) + hi + fold(lo, hi)) & M64);
}

function mid(b) {
  const len = b.length;
  let acc = mul(BigInt(len), P64_1);
  const add = (o, so) => { acc = (acc + mix16(b, o, so)) & M64; };
  if (len <= 128) {
    if (len > 32) {
      if (len > 64) {
        if (len > 96) { add(48, 96); add(len - 64, 112); }
        add(32, 64); add(len - 48, 80);
      }
      add(16, 32); add(len - 32, 48);
    }
    add(0, 0); add(len - 16, 16);
    return avalanche(acc);
  }
  const rounds = Math.floor(len / 16);
  for (let i = 0; i < 8; i++) add(16 * i, 16 * i);
  acc = avalanche(acc);
  for (let i = 8; i < rounds; i++) add(16 * i, 16 * (i - 8) + 3);
  add(len - 16, 136 - 17);
  return avalanche(acc);
}

function stripe(acc, b, o, so) {
  for (let i = 0; i < 8; i++) {
    const v = r64(b, o + 8 * i);
    const k = v ^ r64(SECRET, so + 8 * i);
    acc[i ^ 1] = (acc[i ^ 1] + v) & M64;
    acc[i] = (acc[i] + (k & 0xFFFFFFFFn) * (k >> 32n)) & M64;
  }
}

function long(b) {
  const len = b.length;
  const acc = [P32_3, P64_1, P64_2, P64_3, P64_4, P32_2, P64_5, P32_1];
  const perBlock = (SECRET.length - 64) / 8;
  const blockLen = 64 * perBlock;
  const blocks = Math.floor((len - 1) / blockLen);
  for (let n = 0; n < blocks; n++) {
    for (let s = 0; s < perBlock; s++) stripe(acc, b, n * blockLen + 64 * s, 8 * s);
    for (let i = 0; i < 8; i++) {
      let a = acc[i];
      a ^= a >> 47n;
      a ^= r64(SECRET, SECRET.length - 64 + 8 * i);
      acc[i] = mul(a, P32_1);
    }
  }
  const stripes = Math.floor(((len - 1) - blockLen * blocks) / 64);
  for (let s = 0; s < stripes; s++) stripe(acc, b, blocks * blockLen + 64 * s, 8 * s);
  stripe(acc, b, len - 64, SECRET.length - 64 - 7);
  let result = mul(BigInt(len), P64_1);
  for (let i = 0; i < 4; i++) {
    result = (result + fold(acc[2 * i] ^ r64(SECRET, 11 + 16 * i), acc[2 * i + 1] ^ r64(SECRET, 11 + 16 * i + 8))) & M64;
  }
  return avalanche(result);
}

/**
 * XXH3-64 of `bytes` with seed 0.
 * @param {Uint8Array} bytes - input.
 * @returns {bigint} the 64-bit digest.
 */
export function xxh3_64(bytes) {
  if (bytes.length <= 16) return short(bytes);
  if (bytes.length <= 240) return mid(bytes);
  return long(bytes);
}

/**
 * Lowercase, zero-padded 16-digit hex of {@link xxh3_64} (what the xxhash
 * library's `xxh3_64_hexdigest` prints).
 * @param {Uint8Array} bytes - input.
 * @returns {string} 16 hex digits.
 */
export function xxh3_64_hex(bytes) {
  return xxh3_64(bytes).toString(16).padStart(16, '0');
}
