// The job token: a secret every process of a job holds, proved on every
// connection before anything else is read from it.
//
// The proof is a mutual challenge-response with HMAC-SHA256 (OpenSSL): the
// listening side sends a random nonce; the connecting side answers with its
// own nonce and HMAC(token, "troupe client" | server nonce | client nonce);
// the listener checks it (in constant time) and answers with
// HMAC(token, "troupe server" | client nonce | server nonce), which the
// connecting side checks. Every message has a fixed size, so a peer without
// the token can make neither side read more than 72 bytes, and every read
// has a deadline. The token itself never crosses the wire.
//
//   auto token = comm::new_job_token();                 // the launcher
//   RETURN_IF_ERROR(comm::accept_proof(fd, *token, deadline));   // listener
//   RETURN_IF_ERROR(comm::prove_token(fd, *token, deadline));    // connector
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "comm/socket_io.h"

namespace troupe::comm {

// 32 random bytes from OpenSSL's generator, as 64 hex digits.
absl::StatusOr<std::string> new_job_token();
// A token read from the environment or a file must be at least this long.
constexpr std::size_t kMinTokenLength = 16;

// The listening side of the handshake on a fresh connection: OK when the
// peer proved `token` (and has heard our proof); PermissionDenied when it
// did not; DeadlineExceeded / Unavailable when it said too little in time.
absl::Status accept_proof(int fd, const std::string& token, SteadyTime deadline);
// accept_proof in two halves, for a listener that waits on many new
// connections at once: the challenge goes out at accept (the connecting side
// speaks only after it), the answer is checked once the socket is readable.
absl::StatusOr<std::string> send_challenge(int fd, SteadyTime deadline);  // the nonce sent
absl::Status check_answer(int fd, const std::string& token, const std::string& nonce,
                          SteadyTime deadline);
// The same check on bytes already read (kAnswerBytes of them): the proof to
// send back, or PermissionDenied.
constexpr std::size_t kAnswerBytes = 72;
absl::StatusOr<std::string> answer_proof(const std::string& token, const std::string& nonce,
                                         absl::string_view answer);
// The connecting side: OK when both proofs held; PermissionDenied when the
// listener refused ours or failed its own (not our job's listener).
absl::Status prove_token(int fd, const std::string& token, SteadyTime deadline);

}  // namespace troupe::comm
