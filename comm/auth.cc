// Job-token handshake; see comm/auth.h.
#include "comm/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <array>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace troupe::comm {
namespace {

constexpr std::uint32_t kAuthMagic = 0x41505254;  // "TRPA"
constexpr std::uint32_t kVersion = 1;
using Nonce = std::array<unsigned char, 32>;
using Mac = std::array<unsigned char, 32>;

struct Challenge {
  std::uint32_t magic, version;
  Nonce nonce;
};
struct Answer {
  std::uint32_t magic, version;
  Nonce nonce;
  Mac mac;
};

absl::Status random_nonce(Nonce* n) {
  if (RAND_bytes(n->data(), static_cast<int>(n->size())) != 1)
    return absl::InternalError("OpenSSL RAND_bytes failed");
  return absl::OkStatus();
}

Mac mac_of(const std::string& token, absl::string_view role, const Nonce& a, const Nonce& b) {
  std::string msg(role);
  msg.append(reinterpret_cast<const char*>(a.data()), a.size());
  msg.append(reinterpret_cast<const char*>(b.data()), b.size());
  Mac out{};
  unsigned int len = 0;
  HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
       reinterpret_cast<const unsigned char*>(msg.data()), msg.size(), out.data(), &len);
  return out;
}

bool equal(const Mac& a, const Mac& b) { return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0; }

}  // namespace

absl::StatusOr<std::string> new_job_token() {
  Nonce n;
  if (absl::Status st = random_nonce(&n); !st.ok()) return st;
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(n.data()), n.size()));
}

absl::StatusOr<std::string> send_challenge(int fd, SteadyTime deadline) {
  Challenge c{kAuthMagic, kVersion, {}};
  if (absl::Status st = random_nonce(&c.nonce); !st.ok()) return st;
  if (absl::Status st = write_full(fd, &c, sizeof c, deadline); !st.ok()) return st;
  return std::string(reinterpret_cast<const char*>(c.nonce.data()), c.nonce.size());
}

absl::StatusOr<std::string> answer_proof(const std::string& token, const std::string& nonce,
                                         absl::string_view answer) {
  static_assert(sizeof(Answer) == kAnswerBytes);
  Nonce mine{};
  if (nonce.size() != mine.size() || answer.size() != sizeof(Answer))
    return absl::InternalError("a nonce or answer of the wrong size");
  std::memcpy(mine.data(), nonce.data(), mine.size());
  Answer a{};
  std::memcpy(&a, answer.data(), sizeof a);
  if (a.magic != kAuthMagic || a.version != kVersion)
    return absl::PermissionDeniedError("not a troupe handshake");
  if (!equal(a.mac, mac_of(token, "troupe client", mine, a.nonce)))
    return absl::PermissionDeniedError("the job token does not match");
  const Mac proof = mac_of(token, "troupe server", a.nonce, mine);
  return std::string(reinterpret_cast<const char*>(proof.data()), proof.size());
}

absl::Status check_answer(int fd, const std::string& token, const std::string& nonce,
                          SteadyTime deadline) {
  std::string answer(kAnswerBytes, '\0');
  if (absl::Status st = read_full(fd, answer.data(), answer.size(), deadline); !st.ok()) return st;
  auto proof = answer_proof(token, nonce, answer);
  if (!proof.ok()) return proof.status();
  return write_full(fd, proof->data(), proof->size(), deadline);
}

absl::Status accept_proof(int fd, const std::string& token, SteadyTime deadline) {
  auto nonce = send_challenge(fd, deadline);
  if (!nonce.ok()) return nonce.status();
  return check_answer(fd, token, *nonce, deadline);
}

absl::Status prove_token(int fd, const std::string& token, SteadyTime deadline) {
  Challenge c{};
  if (absl::Status st = read_full(fd, &c, sizeof c, deadline); !st.ok()) return st;
  if (c.magic != kAuthMagic || c.version != kVersion)
    return absl::PermissionDeniedError("the listener is not a troupe job");
  Answer a{kAuthMagic, kVersion, {}, {}};
  if (absl::Status st = random_nonce(&a.nonce); !st.ok()) return st;
  a.mac = mac_of(token, "troupe client", c.nonce, a.nonce);
  if (absl::Status st = write_full(fd, &a, sizeof a, deadline); !st.ok()) return st;
  Mac theirs{};
  absl::Status st = read_full(fd, theirs.data(), theirs.size(), deadline);
  if (absl::IsUnavailable(st))
    return absl::PermissionDeniedError("the listener closed the connection: wrong job token?");
  if (!st.ok()) return st;
  if (!equal(theirs, mac_of(token, "troupe server", a.nonce, c.nonce)))
    return absl::PermissionDeniedError("the listener does not hold this job's token");
  return absl::OkStatus();
}

}  // namespace troupe::comm
