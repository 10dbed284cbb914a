package pgconfig_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

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
