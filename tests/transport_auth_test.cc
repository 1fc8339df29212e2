// transport/auth.h: proofs, secrets, and the shared mutual-authentication
// exchange over real tcp:// connections on 127.0.0.1 (BasicAuthWire).

#include "transport/auth.h"

#include <gtest/gtest.h>

#include <future>
#include <memory>
#include <string>

#include "base/file.h"
#include "tests/testing/test_util.h"
#include "transport/builtin.h"
#include "transport/registry.h"

namespace canopy::transport {
namespace {

std::string Nonce(char c) { return std::string(kAuthNonceBytes, c); }

TEST(AuthProofTest, ProofsDependOnSecretSideAndNonces) {
  const std::string na = Nonce('a'), nb = Nonce('b'), nc = Nonce('c');
  AuthTranscript t{"prod", "1", "2", na, nb};
  std::string p = ComputeProof("secret-1234", ProofSide::kListener, t);
  EXPECT_EQ(p.size(), kAuthProofBytes);
  EXPECT_TRUE(ProofsEqual(p, ComputeProof("secret-1234", ProofSide::kListener, t)));
  EXPECT_FALSE(ProofsEqual(p, ComputeProof("secret-1235", ProofSide::kListener, t)));
  EXPECT_FALSE(ProofsEqual(p, ComputeProof("secret-1234", ProofSide::kDialer, t)));
  AuthTranscript t2 = t;
  t2.listener_nonce = nc;
  EXPECT_FALSE(ProofsEqual(p, ComputeProof("secret-1234", ProofSide::kListener, t2)));
  EXPECT_FALSE(ProofsEqual(p, p.substr(1)));
  EXPECT_FALSE(ProofsEqual("", ""));
  auto n1 = RandomNonce();
  auto n2 = RandomNonce();
  ASSERT_TRUE(n1.ok() && n2.ok());
  EXPECT_EQ(n1->size(), kAuthNonceBytes);
  EXPECT_NE(*n1, *n2);
}

TEST(AuthProofTest, LoadSharedSecret) {
  EXPECT_EQ(*LoadSharedSecret("abcdefgh", ""), "abcdefgh");
  EXPECT_FALSE(LoadSharedSecret("short", "").ok());
  EXPECT_FALSE(LoadSharedSecret("", "").ok());
  EXPECT_FALSE(LoadSharedSecret("abcdefgh", "/x").ok());
  EXPECT_FALSE(LoadSharedSecret("", "/nonexistent/secret").ok());
  testing::TempDir dir;
  ASSERT_TRUE(WriteFileAtomic(dir.File("s"), "0123456789\n").ok());
  EXPECT_EQ(*LoadSecretFile(dir.File("s")), "0123456789");
  ASSERT_TRUE(WriteFileAtomic(dir.File("empty"), "\n").ok());
  EXPECT_FALSE(LoadSecretFile(dir.File("empty")).ok());
  EXPECT_FALSE(LoadSecretFile("").ok());
}

TEST(AuthProofTest, BasicWireRoundTripsAndRefusesGarbage) {
  BasicAuthWire wire(0x7f00);
  AuthHello hello{"rcopy", "client-1", Nonce('h')};
  auto h = wire.DecodeHello(wire.EncodeHello(hello));
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->realm, "rcopy");
  EXPECT_EQ(h->id, "client-1");
  EXPECT_EQ(h->nonce, hello.nonce);
  AuthChallenge challenge{"server", Nonce('c'), std::string(kAuthProofBytes, 'p')};
  auto c = wire.DecodeChallenge(wire.EncodeChallenge(challenge));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->proof, challenge.proof);
  EXPECT_EQ(*wire.DecodeProof(wire.EncodeProof(challenge.proof)), challenge.proof);
  EXPECT_EQ(*wire.DecodeWelcome(wire.EncodeWelcome("server")), "server");
  // Every truncation of an encoded HELLO / CHALLENGE is an error.
  std::string encoded = wire.EncodeHello(hello);
  for (size_t n = 0; n < encoded.size(); ++n) EXPECT_FALSE(wire.DecodeHello(encoded.substr(0, n)).ok()) << n;
  std::string ch = wire.EncodeChallenge(challenge);
  for (size_t n = 0; n < ch.size(); ++n) EXPECT_FALSE(wire.DecodeChallenge(ch.substr(0, n)).ok()) << n;
  EXPECT_FALSE(wire.DecodeProof(wire.EncodeProof("short")).ok());
  EXPECT_TRUE(wire.DecodeHello(encoded + "x").status().IsCorruption());
  encoded[0] = 9;  // another version
  EXPECT_EQ(wire.DecodeHello(encoded).status().code(), StatusCode::kNotSupported);
}

// One listener on 127.0.0.1 that authenticates each connection it accepts.
class AuthExchangeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterBuiltinTransports();
    auto listener = ListenOn("tcp://127.0.0.1:0", TransportOptions{});
    ASSERT_TRUE(listener.ok()) << listener.status().ToString();
    listener_ = std::move(listener).value();
    uri_ = listener_->local_endpoint().ToUri();
  }

  // Accepts one connection and authenticates it as `self`; then, if it
  // passed, receives one message and returns its payload as the id.
  std::future<Result<std::string>> ServeOne(AuthIdentity self) {
    return std::async(std::launch::async, [this, self]() -> Result<std::string> {
      CANOPY_ASSIGN_OR_RETURN(auto conn, listener_->Accept(Deadline::After(std::chrono::seconds(10))));
      BasicAuthWire wire(0x7f00);
      CANOPY_ASSIGN_OR_RETURN(AuthHello hello,
                              AuthenticateListener(*conn, wire, self, Deadline::After(std::chrono::seconds(10))));
      CANOPY_ASSIGN_OR_RETURN(Message data, conn->Receive(Deadline::After(std::chrono::seconds(10))));
      return hello.id + ":" + data.payload;
    });
  }

  Result<std::string> DialAndSend(const AuthIdentity& self) {
    CANOPY_ASSIGN_OR_RETURN(auto conn, Dial(uri_, TransportOptions{}));
    BasicAuthWire wire(0x7f00);
    CANOPY_ASSIGN_OR_RETURN(std::string peer,
                            AuthenticateDialer(*conn, wire, self, Deadline::After(std::chrono::seconds(10))));
    CANOPY_RETURN_IF_ERROR(conn->Send(0x7001, "data"));
    (void)conn->Shutdown();
    return peer;
  }

  std::unique_ptr<Listener> listener_;
  std::string uri_;
};

TEST_F(AuthExchangeTest, SameSecretAuthenticatesBothWays) {
  auto served = ServeOne({"rcopy", "server", "the shared secret"});
  auto dialed = DialAndSend({"rcopy", "client-7", "the shared secret"});
  ASSERT_TRUE(dialed.ok()) << dialed.status().ToString();
  EXPECT_EQ(*dialed, "server");
  auto got = served.get();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, "client-7:data");
}

TEST_F(AuthExchangeTest, WrongSecretIsRefusedBeforeAnyDataByte) {
  auto served = ServeOne({"rcopy", "server", "the shared secret"});
  // The dialer with another secret finds out first (the listener's proof does
  // not check out), tells the listener, and never sends its data.
  auto dialed = DialAndSend({"rcopy", "client", "another secret!"});
  ASSERT_FALSE(dialed.ok());
  EXPECT_EQ(dialed.status().code(), StatusCode::kPermissionDenied) << dialed.status().ToString();
  auto got = served.get();
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kPermissionDenied) << got.status().ToString();
}

TEST_F(AuthExchangeTest, ForgedProofIsRefusedAndTold) {
  auto served = ServeOne({"rcopy", "server", "the shared secret"});
  auto conn = Dial(uri_, TransportOptions{});
  ASSERT_TRUE(conn.ok());
  BasicAuthWire wire(0x7f00);
  ASSERT_TRUE((*conn)->Send(wire.TypeOf(AuthWire::Step::kHello),
                            wire.EncodeHello({"rcopy", "intruder", Nonce('n')})).ok());
  auto challenge = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(challenge.ok());
  ASSERT_EQ(challenge->type, wire.TypeOf(AuthWire::Step::kChallenge));
  ASSERT_TRUE((*conn)->Send(wire.TypeOf(AuthWire::Step::kProof),
                            wire.EncodeProof(std::string(kAuthProofBytes, 'x'))).ok());
  ASSERT_TRUE((*conn)->Send(0x7001, "data that must not be read").ok());
  auto refusal = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(refusal.ok()) << refusal.status().ToString();
  Status why = wire.Unexpected(*refusal, AuthWire::Step::kWelcome);
  EXPECT_EQ(why.code(), StatusCode::kPermissionDenied) << why.ToString();
  EXPECT_NE(why.message().find("wrong shared secret"), std::string::npos) << why.ToString();
  EXPECT_EQ(served.get().status().code(), StatusCode::kPermissionDenied);
}

TEST_F(AuthExchangeTest, WrongRealmAndPlainProtocolAreRefused) {
  auto served = ServeOne({"rcopy", "server", "the shared secret"});
  auto dialed = DialAndSend({"bench", "client", "the shared secret"});
  ASSERT_FALSE(dialed.ok());
  EXPECT_EQ(dialed.status().code(), StatusCode::kPermissionDenied) << dialed.status().ToString();
  EXPECT_EQ(served.get().status().code(), StatusCode::kPermissionDenied);

  // A peer that speaks the data protocol straight away (no secret configured).
  served = ServeOne({"rcopy", "server", "the shared secret"});
  auto conn = Dial(uri_, TransportOptions{});
  ASSERT_TRUE(conn.ok());
  ASSERT_TRUE((*conn)->Send(0x5201, "OPEN without authenticating").ok());
  auto got = served.get();
  EXPECT_EQ(got.status().code(), StatusCode::kPermissionDenied) << got.status().ToString();
  EXPECT_NE(got.status().message().find("authentication required"), std::string::npos) << got.status().ToString();
  auto refusal = (*conn)->Receive(Deadline::After(std::chrono::seconds(10)));
  ASSERT_TRUE(refusal.ok());
  EXPECT_EQ(refusal->type, BasicAuthWire(0x7f00).refusal_type());
}

}  // namespace
}  // namespace canopy::transport
