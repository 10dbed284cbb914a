package cli

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"time"
)

func healthcheckCommand() *command {
	return &command{name: "healthcheck", summary: "exit 0 when the daemon's /healthz answers 200, else 1 (for HEALTHCHECK without a shell)", run: healthcheck}
}

// defaultHealthURL is /healthz on `relay run`'s default --http-addr port,
// asked on the loopback address, where a container's own check reaches it.
const defaultHealthURL = "http://127.0.0.1:9464/healthz"

// healthcheck asks one URL once: status 200 is healthy, anything else
// (another status, no answer within --timeout) is an error naming it.
func healthcheck(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay healthcheck", stdio)
	rawURL := fs.String("url", defaultHealthURL, "URL asked; 200 is healthy (e.g. /readyz instead of /healthz to ask for readiness)")
	timeout := fs.Duration("timeout", 3*time.Second, "how long the answer may take")
	caFile := fs.String("tls-ca-file", "", "PEM CAs of the daemon's HTTPS certificate, for an https URL (when it runs with --http-tls-cert-file)")
	if err := parse(fs, args, stdio, false); err != nil {
		return err
	}
	u, err := url.Parse(*rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return usagef("--url %q: want http://host:port/path or https://host:port/path", *rawURL)
	}
	if *timeout <= 0 {
		return usagef("--timeout must be positive")
	}
	if *caFile != "" && u.Scheme != "https" {
		return usagef("--tls-ca-file needs an https --url")
	}
	client := &http.Client{Timeout: *timeout}
	if *caFile != "" {
		pem, err := os.ReadFile(*caFile)
		if err != nil {
			return fmt.Errorf("--tls-ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("--tls-ca-file %s: no PEM certificate in it", *caFile)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return usagef("--url %q: %v", *rawURL, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return fmt.Errorf("unhealthy: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("unhealthy: %s answered %s: %s", u.Redacted(), resp.Status, body)
	}
	fmt.Fprintf(stdio.Stdout, "healthy: %s answered %s\n", u.Redacted(), resp.Status)
	return nil
}
