// Package testcerts makes a throwaway certificate authority with server
// and client certificates for tests, written as PEM files into the test's
// temporary directory, so that no private key is ever committed.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Set is a CA and the files of certificates it signed.
type Set struct {
	Dir    string
	CAFile string
	// ServerCert and ServerKey are valid for 127.0.0.1, ::1 and localhost.
	ServerCert, ServerKey string
	// ClientCert and ClientKey name the client ClientName (common name).
	ClientCert, ClientKey string
	ClientName            string
	// KeyPEM is the server's private key, for tests that look for it in
	// output.
	KeyPEM string
	pool   *x509.CertPool
}

// New makes a CA and a server and a client certificate in t.TempDir().
func New(t testing.TB, clientName string) *Set {
	t.Helper()
	dir := t.TempDir()
	ca := issue(t, &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "relay test CA"},
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}, nil)
	s := &Set{Dir: dir, ClientName: clientName, pool: x509.NewCertPool()}
	s.pool.AddCert(ca.cert)
	s.CAFile = writePEM(t, dir, "ca.pem", "CERTIFICATE", ca.cert.Raw)

	leaf := func(name string, serial int64, usage x509.ExtKeyUsage, server bool) (certFile, keyFile, keyPEM string) {
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		c := issue(t, tmpl, &ca)
		keyDER, err := x509.MarshalPKCS8PrivateKey(c.key)
		if err != nil {
			t.Fatal(err)
		}
		certFile = writePEM(t, dir, name+".pem", "CERTIFICATE", c.cert.Raw)
		keyFile = writePEM(t, dir, name+"-key.pem", "PRIVATE KEY", keyDER)
		return certFile, keyFile, string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}))
	}
	s.ServerCert, s.ServerKey, s.KeyPEM = leaf("localhost", 2, x509.ExtKeyUsageServerAuth, true)
	s.ClientCert, s.ClientKey, _ = leaf(clientName, 3, x509.ExtKeyUsageClientAuth, false)
	return s
}

// ServerConfig is a TLS server configuration with the server certificate;
// with clientAuth, it requires client certificates signed by the CA.
func (s *Set) ServerConfig(t testing.TB, clientAuth bool) *tls.Config {
	t.Helper()
	cert, err := tls.LoadX509KeyPair(s.ServerCert, s.ServerKey)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}
	if clientAuth {
		cfg.ClientCAs, cfg.ClientAuth = s.pool, tls.RequireAndVerifyClientCert
	}
	return cfg
}

// ClientConfig trusts the CA and, with withCert, presents the client
// certificate.
func (s *Set) ClientConfig(t testing.TB, withCert bool) *tls.Config {
	t.Helper()
	cfg := &tls.Config{RootCAs: s.pool, ServerName: "localhost"}
	if withCert {
		cert, err := tls.LoadX509KeyPair(s.ClientCert, s.ClientKey)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// certificate is a certificate and its private key.
type certificate struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

// issue makes a new key and a certificate for it from tmpl, valid from an
// hour ago for a day, signed by ca (self-signed when ca is nil).
func issue(t testing.TB, tmpl *x509.Certificate, ca *certificate) certificate {
	t.Helper()
	key := newKey(t)
	tmpl.NotBefore, tmpl.NotAfter = time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour)
	parent, signer := tmpl, key
	if ca != nil {
		parent, signer = ca.cert, ca.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return certificate{cert: cert, key: key}
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
