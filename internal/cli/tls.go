package cli

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// serverTLSFlags are a listener's TLS files.
type serverTLSFlags struct {
	certFile     string
	keyFile      string
	clientCAFile string
}

// config loads the files into a server configuration, nil when no
// certificate is named. prefix names the flags in errors; an error names
// a file, never its contents.
func (f serverTLSFlags) config(prefix string) (*tls.Config, error) {
	if f.certFile == "" && f.keyFile == "" && f.clientCAFile == "" {
		return nil, nil
	}
	if f.certFile == "" || f.keyFile == "" {
		return nil, usagef("--%s-tls-cert-file and --%s-tls-key-file go together", prefix, prefix)
	}
	cert, err := tls.LoadX509KeyPair(f.certFile, f.keyFile)
	if err != nil {
		return nil, fmt.Errorf("--%s-tls-cert-file %s with --%s-tls-key-file %s: %w", prefix, f.certFile, prefix, f.keyFile, err)
	}
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if f.clientCAFile != "" {
		pem, err := os.ReadFile(f.clientCAFile)
		if err != nil {
			return nil, fmt.Errorf("--%s-tls-client-ca-file: %w", prefix, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--%s-tls-client-ca-file %s: no PEM certificate in it", prefix, f.clientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}
