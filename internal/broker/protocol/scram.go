package protocol

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strconv"
	"strings"
)

// SASL mechanisms the listener offers.
const (
	MechanismPlain     = "PLAIN"
	MechanismSCRAM256  = "SCRAM-SHA-256"
	MechanismSCRAM512  = "SCRAM-SHA-512"
	MinSCRAMIterations = 4096
)

// SCRAMMechanisms are the mechanisms a Credential can be made for.
var SCRAMMechanisms = []string{MechanismSCRAM256, MechanismSCRAM512}

// Credential is a user's stored SCRAM credential (RFC 5802): the salt, the
// iteration count and the two keys derived from the password. The password
// itself is not kept and cannot be recovered from it; it proves a SCRAM
// exchange and checks a PLAIN password.
type Credential struct {
	Mechanism  string
	Salt       []byte
	Iterations int
	StoredKey  []byte
	ServerKey  []byte
}

// String shows the mechanism and iterations only, so that a credential
// printed by mistake shows no key material.
func (c Credential) String() string {
	return fmt.Sprintf("%s credential (%d iterations)", c.Mechanism, c.Iterations)
}

func scramHash(mechanism string) (func() hash.Hash, error) {
	switch mechanism {
	case MechanismSCRAM256:
		return sha256.New, nil
	case MechanismSCRAM512:
		return sha512.New, nil
	}
	return nil, fmt.Errorf("protocol: %q is not a SCRAM mechanism (want %s or %s)", mechanism, MechanismSCRAM256, MechanismSCRAM512)
}

// NewCredential derives a credential for password with a fresh random
// salt; iterations below MinSCRAMIterations are refused.
func NewCredential(mechanism, password string, iterations int) (Credential, error) {
	if iterations < MinSCRAMIterations {
		return Credential{}, fmt.Errorf("protocol: %d SCRAM iterations: at least %d", iterations, MinSCRAMIterations)
	}
	salt := make([]byte, 24)
	rand.Read(salt)
	return deriveCredential(mechanism, password, salt, iterations)
}

func deriveCredential(mechanism, password string, salt []byte, iterations int) (Credential, error) {
	h, err := scramHash(mechanism)
	if err != nil {
		return Credential{}, err
	}
	salted, err := pbkdf2.Key(h, password, salt, iterations, h().Size())
	if err != nil {
		return Credential{}, fmt.Errorf("protocol: deriving the SCRAM key: %w", err)
	}
	clientKey := hmacOf(h, salted, []byte("Client Key"))
	return Credential{
		Mechanism:  mechanism,
		Salt:       salt,
		Iterations: iterations,
		StoredKey:  hashOf(h, clientKey),
		ServerKey:  hmacOf(h, salted, []byte("Server Key")),
	}, nil
}

// Verify reports whether password is the one c was derived from (PLAIN
// authentication against a stored SCRAM credential).
func (c Credential) Verify(password string) bool {
	d, err := deriveCredential(c.Mechanism, password, c.Salt, c.Iterations)
	return err == nil && subtle.ConstantTimeCompare(d.StoredKey, c.StoredKey) == 1
}

func hmacOf(h func() hash.Hash, key, msg []byte) []byte {
	m := hmac.New(h, key)
	m.Write(msg)
	return m.Sum(nil)
}

func hashOf(h func() hash.Hash, b []byte) []byte {
	d := h()
	d.Write(b)
	return d.Sum(nil)
}

// errAuth is every authentication failure a client is told about: it says
// neither whether the user exists nor what was wrong with the proof.
var errAuth = errors.New("authentication failed: invalid credentials")

// scramServer is the server side of one SCRAM exchange.
//
// It is written here rather than taken from github.com/xdg-go/scram, the
// Go library for it, because that library checks the client's final nonce
// for equality with the server's, as RFC 5802 says, and Kafka checks only
// that it ends with it: librdkafka (Debian's, through kcat) sends its own
// nonce again in front of the combined one, so with the library every
// librdkafka client failed to authenticate (TestSASLOverTLSWithKcat,
// tried on 2026-12-01). The key derivation is the standard library's
// (crypto/pbkdf2, crypto/hmac).
type scramServer struct {
	mechanism   string
	user        string
	cred        Credential
	clientBare  string
	serverFirst string
	nonce       string
}

// parseSCRAMClientFirst reads client-first-message: "n,[a=authzid],n=user,r=nonce".
// Channel binding and extensions are refused, as Kafka does.
func parseSCRAMClientFirst(msg []byte) (user, nonce, bare string, err error) {
	s := string(msg)
	if !strings.HasPrefix(s, "n,") {
		return "", "", "", errors.New("SCRAM: channel binding is not supported (want a gs2 header of n,)")
	}
	rest := s[2:]
	i := strings.IndexByte(rest, ',')
	if i < 0 {
		return "", "", "", errors.New("SCRAM: malformed client-first-message")
	}
	authzid, bare := rest[:i], rest[i+1:]
	attrs := strings.Split(bare, ",")
	if len(attrs) != 2 || !strings.HasPrefix(attrs[0], "n=") || !strings.HasPrefix(attrs[1], "r=") || len(attrs[1]) < 3 {
		return "", "", "", errors.New("SCRAM: malformed client-first-message (want n=user,r=nonce, no extensions)")
	}
	user, err = scramUnescape(attrs[0][2:])
	if err != nil {
		return "", "", "", err
	}
	if authzid != "" {
		az, err := scramUnescape(strings.TrimPrefix(authzid, "a="))
		if err != nil || !strings.HasPrefix(authzid, "a=") || az != user {
			return "", "", "", errors.New("SCRAM: an authorization id other than the user is not supported")
		}
	}
	return user, attrs[1][2:], bare, nil
}

func scramUnescape(s string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '=' && strings.HasPrefix(s[i:], "=2C"):
			b.WriteByte(',')
			i += 2
		case s[i] == '=' && strings.HasPrefix(s[i:], "=3D"):
			b.WriteByte('=')
			i += 2
		case s[i] == '=' || s[i] == 0:
			return "", errors.New("SCRAM: malformed user name")
		default:
			b.WriteByte(s[i])
		}
	}
	if b.Len() == 0 {
		return "", errors.New("SCRAM: empty user name")
	}
	return b.String(), nil
}

// first answers client-first with server-first-message.
func (x *scramServer) first(clientNonce string) []byte {
	rnd := make([]byte, 18)
	rand.Read(rnd)
	x.nonce = clientNonce + base64.RawStdEncoding.EncodeToString(rnd)
	x.serverFirst = "r=" + x.nonce + ",s=" + base64.StdEncoding.EncodeToString(x.cred.Salt) + ",i=" + strconv.Itoa(x.cred.Iterations)
	return []byte(x.serverFirst)
}

// final checks client-final-message ("c=biws,r=nonce,p=proof") and
// returns server-final-message.
func (x *scramServer) final(msg []byte) ([]byte, error) {
	s := string(msg)
	i := strings.LastIndex(s, ",p=")
	if i < 0 {
		return nil, errors.New("SCRAM: client-final-message has no proof")
	}
	withoutProof, proof64 := s[:i], s[i+3:]
	attrs := strings.Split(withoutProof, ",")
	// The nonce must end with the server's, as Kafka checks it:
	// librdkafka sends its own nonce again in front of the combined one.
	if len(attrs) != 2 || attrs[0] != "c=biws" || !strings.HasPrefix(attrs[1], "r=") || !strings.HasSuffix(attrs[1], x.nonce) {
		return nil, errors.New("SCRAM: client-final-message has the wrong channel binding or nonce")
	}
	proof, err := base64.StdEncoding.DecodeString(proof64)
	h, herr := scramHash(x.mechanism)
	if err != nil || herr != nil || len(proof) != h().Size() {
		return nil, errors.New("SCRAM: malformed proof")
	}
	authMessage := []byte(x.clientBare + "," + x.serverFirst + "," + withoutProof)
	sig := hmacOf(h, x.cred.StoredKey, authMessage)
	clientKey := make([]byte, len(proof))
	for j := range proof {
		clientKey[j] = proof[j] ^ sig[j]
	}
	if subtle.ConstantTimeCompare(hashOf(h, clientKey), x.cred.StoredKey) != 1 {
		return nil, errAuth
	}
	return []byte("v=" + base64.StdEncoding.EncodeToString(hmacOf(h, x.cred.ServerKey, authMessage))), nil
}

// parsePlain reads a PLAIN token: [authzid] NUL user NUL password.
func parsePlain(tok []byte) (user, password string, err error) {
	parts := strings.SplitN(string(tok), "\x00", 3)
	if len(parts) != 3 || parts[1] == "" {
		return "", "", errors.New("PLAIN: malformed token")
	}
	if parts[0] != "" && parts[0] != parts[1] {
		return "", "", errors.New("PLAIN: an authorization id other than the user is not supported")
	}
	return parts[1], parts[2], nil
}
