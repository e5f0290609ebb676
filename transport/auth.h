// Keyed hashing for the job secret: SipHash-2-4 with a 128-bit tag (Aumasson and Bernstein,
// "SipHash: a fast short-input PRF", 2012), a constant-time comparison, and random bytes.
//
// The secret never crosses the wire: each side proves it knows the secret by sending
// mac(secret, label, transcript) over nonces both sides chose (see wire.h), and names derived
// from the secret (the rendezvous file, communicator ids) are macs of a fixed label, which
// reveal nothing about it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/status.h"

namespace chorus::transport {

using Secret = std::array<uint8_t, 16>;
using Tag = std::array<uint8_t, 16>;
using Nonce = std::array<uint8_t, 16>;

// SipHash-2-4-128 of `data` under `key` (the reference implementation's byte order).
Tag siphash128(const Secret& key, const void* data, size_t n);
// mac(key, label || 0 || data): separates the uses of one key by a label.
Tag mac(const Secret& key, const std::string& label, const void* data, size_t n);
// Compares in time that depends only on n, not on where the bytes differ.
bool equal_constant_time(const void* a, const void* b, size_t n);
// Fills `out` from the kernel's random source (getrandom).
Status random_bytes(void* out, size_t n);
// A 64-bit id derived from the secret and a label (one-way: it does not reveal the secret).
uint64_t derive_id(const Secret& key, const std::string& label);

}  // namespace chorus::transport
