package protocol

import (
	"errors"
	"slices"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// maxPreAuthFrame bounds a frame before authentication (Kafka's
// sasl.server.max.receive.size): a client that has proved nothing cannot
// make the server allocate more.
const maxPreAuthFrame = 512 << 10

// preAuthKeys are the requests a connection may send before it
// authenticated; any other closes it.
var preAuthKeys = map[int16]bool{
	kmsg.ApiVersions.Int16():      true,
	kmsg.SASLHandshake.Int16():    true,
	kmsg.SASLAuthenticate.Int16(): true,
}

// saslState is a connection's progress through SASL.
type saslState struct {
	mechanism string
	scram     *scramServer
}

// rawTokensAfterHandshake is how many unframed tokens a SaslHandshake v0
// for mechanism announces: PLAIN sends one, SCRAM two; none when the
// mechanism is not offered (the handshake then fails).
func (s *Server) rawTokensAfterHandshake(mechanism string) int {
	if s.users == nil || !slices.Contains(s.mechanisms, mechanism) {
		return 0
	}
	if mechanism == MechanismPlain {
		return 1
	}
	return 2
}

// handleSASLHandshake picks the connection's mechanism. v0 goes on with
// unframed tokens, v1 with SaslAuthenticate requests. Re-authentication
// (KIP-368) is not offered: a handshake on an authenticated connection gets
// ILLEGAL_SASL_STATE.
func (s *Server) handleSASLHandshake(c *conn, req *kmsg.SASLHandshakeRequest, resp *kmsg.SASLHandshakeResponse) {
	resp.SupportedMechanisms = slices.Clone(s.mechanisms)
	switch {
	case s.users == nil:
		resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
		resp.SupportedMechanisms = []string{}
	case c.authed.Load() || c.sasl.mechanism != "":
		resp.ErrorCode = kerr.IllegalSaslState.Code
	case !slices.Contains(s.mechanisms, req.Mechanism):
		resp.ErrorCode = kerr.UnsupportedSaslMechanism.Code
	default:
		c.sasl.mechanism = req.Mechanism
	}
}

// handleSASLAuthenticate runs one step of the exchange. A failure is
// answered with SASL_AUTHENTICATION_FAILED and a message that names no
// user or reason, and then the connection is closed.
func (s *Server) handleSASLAuthenticate(c *conn, req *kmsg.SASLAuthenticateRequest, resp *kmsg.SASLAuthenticateResponse) {
	if c.authed.Load() && s.users != nil || c.sasl.mechanism == "" {
		resp.ErrorCode = kerr.IllegalSaslState.Code
		return
	}
	tok, err := s.saslStep(c, req.SASLAuthBytes)
	if err != nil {
		s.saslFailed(c, err)
		resp.ErrorCode = kerr.SaslAuthenticationFailed.Code
		msg := errAuth.Error()
		resp.ErrorMessage = &msg
		c.closeAfterReply = true
		return
	}
	resp.SASLAuthBytes = tok
}

// errBadSASL marks a malformed exchange, as opposed to wrong credentials.
var errBadSASL = errors.New("malformed SASL exchange")

// saslStep consumes one client token and returns the server's answer
// (non-nil, possibly empty). The connection is authenticated when PLAIN
// checked out or the SCRAM proof did.
func (s *Server) saslStep(c *conn, tok []byte) ([]byte, error) {
	switch mech := c.sasl.mechanism; {
	case mech == MechanismPlain:
		user, password, err := parsePlain(tok)
		if err != nil {
			return nil, errors.Join(errBadSASL, err)
		}
		for _, m := range []string{MechanismSCRAM512, MechanismSCRAM256} {
			cred, ok, err := s.users.Credential(user, m)
			if err != nil {
				return nil, err
			}
			if ok {
				if !cred.Verify(password) {
					return nil, errAuth
				}
				s.authenticated(c, user)
				return []byte{}, nil
			}
		}
		return nil, errAuth
	case c.sasl.scram == nil:
		user, nonce, bare, err := parseSCRAMClientFirst(tok)
		if err != nil {
			return nil, errors.Join(errBadSASL, err)
		}
		cred, ok, err := s.users.Credential(user, mech)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errAuth
		}
		c.sasl.scram = &scramServer{mechanism: mech, user: user, cred: cred, clientBare: bare}
		return c.sasl.scram.first(nonce), nil
	default:
		final, err := c.sasl.scram.final(tok)
		if err != nil && !errors.Is(err, errAuth) {
			err = errors.Join(errBadSASL, err)
		}
		if err != nil {
			return nil, err
		}
		s.authenticated(c, c.sasl.scram.user)
		c.sasl.scram = nil
		return final, nil
	}
}

func (s *Server) authenticated(c *conn, user string) {
	c.principal = "User:" + user
	c.authed.Store(true)
}

// saslFailed counts and logs a failed authentication. The log names the
// remote address and the mechanism: not the user name (people type
// passwords into it) and never the tokens.
func (s *Server) saslFailed(c *conn, err error) {
	s.stats.authFailures.Add(1)
	switch {
	case errors.Is(err, errAuth):
		s.log.Info("kafka SASL authentication failed", "remote", c.nc.RemoteAddr().String(), "mechanism", c.sasl.mechanism)
	case errors.Is(err, errBadSASL):
		s.log.Info("kafka SASL exchange malformed", "remote", c.nc.RemoteAddr().String(), "mechanism", c.sasl.mechanism, "err", err)
	default:
		s.log.Error("kafka SASL credentials unavailable; refusing every client", "remote", c.nc.RemoteAddr().String(), "err", err)
	}
}
