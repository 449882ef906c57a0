// rankgate's proof-of-work solver (SPEC 2.2, "Entry challenges"), run in a Web Worker so the page stays
// responsive. It finds a nonce such that SHA-256 of "<challenge>:<nonce>" starts with `difficulty` zero
// bits. SHA-256 is written out here (no dependency, no WebCrypto: crypto.subtle exists only in secure
// contexts and answers asynchronously, a thousand times slower per hash). The blocks of the challenge
// prefix are hashed once; each nonce costs one or two compressions of the last block(s).
'use strict';
const K = new Int32Array([
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
]);
const INITIAL = new Int32Array([
  0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
]);
const W = new Int32Array(64);

// One compression of the 64 bytes of `bytes` at `at` into the state `H`.
function compress(H, bytes, at) {
  for (let i = 0; i < 16; i++) {
    const j = at + i * 4;
    W[i] = (bytes[j] << 24) | (bytes[j + 1] << 16) | (bytes[j + 2] << 8) | bytes[j + 3];
  }
  for (let i = 16; i < 64; i++) {
    const w15 = W[i - 15], w2 = W[i - 2];
    const s0 = ((w15 >>> 7) | (w15 << 25)) ^ ((w15 >>> 18) | (w15 << 14)) ^ (w15 >>> 3);
    const s1 = ((w2 >>> 17) | (w2 << 15)) ^ ((w2 >>> 19) | (w2 << 13)) ^ (w2 >>> 10);
    W[i] = (W[i - 16] + s0 + W[i - 7] + s1) | 0;
  }
  let a = H[0], b = H[1], c = H[2], d = H[3], e = H[4], f = H[5], g = H[6], h = H[7];
  for (let i = 0; i < 64; i++) {
    const s1 = ((e >>> 6) | (e << 26)) ^ ((e >>> 11) | (e << 21)) ^ ((e >>> 25) | (e << 7));
    const t1 = (h + s1 + ((e & f) ^ (~e & g)) + K[i] + W[i]) | 0;
    const s0 = ((a >>> 2) | (a << 30)) ^ ((a >>> 13) | (a << 19)) ^ ((a >>> 22) | (a << 10));
    const t2 = (s0 + ((a & b) ^ (a & c) ^ (b & c))) | 0;
    h = g; g = f; f = e; e = (d + t1) | 0; d = c; c = b; b = a; a = (t1 + t2) | 0;
  }
  H[0] = (H[0] + a) | 0; H[1] = (H[1] + b) | 0; H[2] = (H[2] + c) | 0; H[3] = (H[3] + d) | 0;
  H[4] = (H[4] + e) | 0; H[5] = (H[5] + f) | 0; H[6] = (H[6] + g) | 0; H[7] = (H[7] + h) | 0;
}

// Whether the state's digest starts with `difficulty` (0–32) zero bits.
function meets(H, difficulty) {
  return difficulty === 0 || (H[0] >>> (32 - difficulty)) === 0;
}

// Counts from 0 until a nonce solves `challenge`; reports progress every 2^16 hashes.
function solve(challenge, difficulty, report) {
  const prefix = new TextEncoder().encode(challenge + ':');
  const mid = Int32Array.from(INITIAL);
  const whole = prefix.length - (prefix.length % 64);
  for (let at = 0; at < whole; at += 64) compress(mid, prefix, at);
  const tail = prefix.subarray(whole);
  const block = new Uint8Array(128);
  const H = new Int32Array(8);
  for (let nonce = 0; ; nonce++) {
    const digits = String(nonce);
    block.fill(0);
    block.set(tail, 0);
    let length = tail.length;
    for (let i = 0; i < digits.length; i++) block[length++] = digits.charCodeAt(i);
    block[length] = 0x80;
    const blocks = length + 1 + 8 <= 64 ? 1 : 2;
    const bits = (prefix.length + digits.length) * 8;
    const end = blocks * 64;
    block[end - 4] = bits >>> 24; block[end - 3] = (bits >>> 16) & 255;
    block[end - 2] = (bits >>> 8) & 255; block[end - 1] = bits & 255;
    H.set(mid);
    compress(H, block, 0);
    if (blocks === 2) compress(H, block, 64);
    if (meets(H, difficulty)) return nonce;
    if ((nonce & 0xffff) === 0xffff) report(nonce + 1);
  }
}

if (typeof self !== 'undefined' && typeof self.postMessage === 'function' && typeof module === 'undefined') {
  self.onmessage = (event) => {
    const { challenge, difficulty } = event.data;
    const started = Date.now();
    const nonce = solve(challenge, difficulty, (hashes) => self.postMessage({ hashes }));
    self.postMessage({ nonce: String(nonce), hashes: nonce + 1, millis: Date.now() - started });
  };
} else if (typeof module !== 'undefined') {
  module.exports = { solve };
}
