package pgconfig_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestNewPool: the pool has the size asked for and its connections carry
// what adjust set.
func TestNewPool(t *testing.T) {
	ctx := context.Background()
	pool, err := pgconfig.NewPool(ctx, pgtest.NewDatabase(t), 3, func(c *pgx.ConnConfig) {
		c.RuntimeParams["application_name"] = "pgconfig-test"
	})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if got := pool.Config().MaxConns; got != 3 {
		t.Fatalf("MaxConns = %d, want 3", got)
	}
	var name string
	if err := pool.QueryRow(ctx, "SELECT current_setting('application_name')").Scan(&name); err != nil {
		t.Fatal(err)
	}
	if name != "pgconfig-test" {
		t.Fatalf("application_name = %q, want the one adjust set", name)
	}
}

// TestNewPoolErrorHasNoPassword: a URL that does not parse is refused with
// an error that does not repeat its password.
func TestNewPoolErrorHasNoPassword(t *testing.T) {
	const secret = "s3cret-pw"
	_, err := pgconfig.NewPool(context.Background(), "postgres://relay:"+secret+"@localhost:notaport/db", 2, nil)
	if err == nil {
		t.Fatal("NewPool accepted a URL with an invalid port")
	}
	if strings.Contains(err.Error(), secret) {
		t.Fatalf("the error shows the password: %v", err)
	}
}

// TestRefused sorts the server's answers into those asking again will not
// change and the rest, wrapped as the pool and the migrator wrap them
// (a per-attempt join inside a connection error, then %w).
func TestRefused(t *testing.T) {
	t.Parallel()
	wrapped := func(code string) error {
		attempts := errors.Join(errors.New("tls error: server refused TLS connection"), &pgconn.PgError{Severity: "FATAL", Code: code})
		return fmt.Errorf("reading migration versions: %w", fmt.Errorf("failed to connect: %w", attempts))
	}
	for code, want := range map[string]bool{
		"28P01": true,  // password authentication failed
		"28000": true,  // no pg_hba.conf entry
		"3D000": true,  // no such database
		"42501": true,  // insufficient privilege
		"42P01": true,  // no such table
		"57P01": false, // admin shutdown (a restart)
		"57P03": false, // the server is starting up
		"53300": false, // too many connections
		"08006": false, // connection failure
	} {
		if got := pgconfig.Refused(wrapped(code)); got != want {
			t.Errorf("Refused(%s) = %t, want %t", code, got, want)
		}
	}
	if pgconfig.Refused(errors.New("dial tcp 127.0.0.1:1: connect: connection refused")) {
		t.Error("a refused TCP connection counts as an answer of the server")
	}
	err := pgconfig.Wrap(wrapped("28P01"), "postgres://u:s3cret@h/db", "connecting to PostgreSQL")
	if !pgconfig.Refused(err) || strings.Contains(err.Error(), "\n") {
		t.Errorf("Wrap lost the answer or kept several lines: %q", err)
	}
}
