package cli_test

import (
	"context"
	"encoding/json"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/testbin"
	"github.com/outboxrelay/relay/migrations"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup) }

// relay runs the real binary with env added to a minimal environment.
func relay(t *testing.T, env []string, args ...string) testbin.Result {
	t.Helper()
	r, err := testbin.Run(context.Background(), testbin.Relay(t), append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + os.TempDir()}, env...), args...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func latest(t *testing.T) int {
	m, err := migrations.New("outbox")
	if err != nil {
		t.Fatal(err)
	}
	return m.Latest()
}

type statusJSON struct {
	Schema   string `json:"schema"`
	Current  int    `json:"current"`
	Latest   int    `json:"latest"`
	Versions []struct {
		Version int    `json:"version"`
		State   string `json:"state"`
	} `json:"versions"`
}

func status(t *testing.T, env []string, args ...string) statusJSON {
	t.Helper()
	r := relay(t, env, append([]string{"migrate", "status", "--json"}, args...)...)
	if r.Code != 0 {
		t.Fatalf("migrate status: exit %d: %s", r.Code, r.Stderr)
	}
	var st statusJSON
	if err := json.Unmarshal([]byte(r.Stdout), &st); err != nil {
		t.Fatalf("status output is not JSON: %v\n%s", err, r.Stdout)
	}
	return st
}

func TestMigrateCommands(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	env := []string{"RELAY_DATABASE_URL=" + dbURL}
	n := latest(t)

	if st := status(t, env); st.Current != 0 || st.Latest != n || st.Versions[0].State != "pending" {
		t.Fatalf("fresh status = %+v", st)
	}
	r := relay(t, env, "migrate", "up")
	if r.Code != 0 || !strings.Contains(r.Stdout, "applied 001_outbox") {
		t.Fatalf("migrate up: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if st := status(t, env); st.Current != n {
		t.Fatalf("status after up = %+v", st)
	}
	table := relay(t, env, "migrate", "status")
	if table.Code != 0 || !strings.Contains(table.Stdout, "001") || !strings.Contains(table.Stdout, "applied") {
		t.Fatalf("status table: exit %d\n%s", table.Code, table.Stdout)
	}
	if r := relay(t, env, "migrate", "down", "--to", "0"); r.Code != 0 || !strings.Contains(r.Stdout, "rolled back 001_outbox") {
		t.Fatalf("migrate down --to 0: exit %d\n%s%s", r.Code, r.Stdout, r.Stderr)
	}
	if st := status(t, env); st.Current != 0 {
		t.Fatalf("status after down = %+v", st)
	}
	// The flag wins over the environment, and --schema picks another schema.
	if r := relay(t, []string{"RELAY_DATABASE_URL=postgres://nobody@127.0.0.1:1/x"}, "migrate", "up", "--database-url", dbURL, "--schema", "other"); r.Code != 0 {
		t.Fatalf("migrate up with flags: exit %d: %s", r.Code, r.Stderr)
	}
	if st := status(t, env, "--schema", "other"); st.Current != n {
		t.Fatalf("schema other: %+v", st)
	}
	if st := status(t, env); st.Current != 0 {
		t.Fatalf("schema outbox changed by a migration of schema other: %+v", st)
	}
	if r := relay(t, env, "migrate", "up"); r.Code != 0 {
		t.Fatalf("migrate up again: exit %d: %s", r.Code, r.Stderr)
	}
	if st := status(t, env); st.Current != n {
		t.Fatalf("status after up again = %+v", st)
	}
}

func TestMigrateReadsPGVariables(t *testing.T) {
	t.Parallel()
	u, err := url.Parse(pgtest.NewDatabase(t))
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(u.Host)
	env := []string{"PGHOST=" + host, "PGPORT=" + port, "PGUSER=" + u.User.Username(),
		"PGDATABASE=" + strings.TrimPrefix(u.Path, "/"), "PGSSLMODE=disable"}
	if r := relay(t, env, "migrate", "up"); r.Code != 0 {
		t.Fatalf("migrate up with PG* variables: exit %d: %s", r.Code, r.Stderr)
	}
	if st := status(t, env); st.Current != latest(t) {
		t.Fatalf("status = %+v", st)
	}
}

func TestConcurrentMigrateProcesses(t *testing.T) {
	t.Parallel()
	env := []string{"RELAY_DATABASE_URL=" + pgtest.NewDatabase(t)}
	var wg sync.WaitGroup
	results := make([]testbin.Result, 4)
	for i := range results {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = relay(t, env, "migrate", "up")
		}()
	}
	wg.Wait()
	applied := 0
	for _, r := range results {
		if r.Code != 0 {
			t.Fatalf("a concurrent migrate up failed: exit %d: %s", r.Code, r.Stderr)
		}
		applied += strings.Count(r.Stdout, "applied ")
	}
	if n := latest(t); applied != n {
		t.Fatalf("4 processes applied %d migrations in all, want %d (each version once)", applied, n)
	}
	if st := status(t, env); st.Current != latest(t) {
		t.Fatalf("status = %+v", st)
	}
}

func TestNewerSchemaGivesClearError(t *testing.T) {
	t.Parallel()
	dbURL := pgtest.NewDatabase(t)
	env := []string{"RELAY_DATABASE_URL=" + dbURL}
	if r := relay(t, env, "migrate", "up"); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	conn := pgtest.Connect(t, dbURL)
	if _, err := conn.Exec(context.Background(), "INSERT INTO outbox.schema_migrations (version, name) VALUES (999, 'future')"); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "down"}, {"migrate", "status"}} {
		r := relay(t, env, args...)
		if r.Code != 1 || !strings.Contains(r.Stderr, "newer relay") || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 {
			t.Fatalf("%v: exit %d, stderr %q; want exit 1 and one line naming a newer relay", args, r.Code, r.Stderr)
		}
	}
}

// TestBadConnectionIsOneLineWithoutPassword covers an unparsable URL and an
// unreachable server, given by flag, by RELAY_DATABASE_URL and by PG*.
func TestBadConnectionIsOneLineWithoutPassword(t *testing.T) {
	t.Parallel()
	const secret = "s3cr3t-Pa55"
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := strconv.Itoa(free.Addr().(*net.TCPAddr).Port)
	free.Close()
	cases := []struct {
		name string
		env  []string
		args []string
		want string
	}{
		{"bad port", nil, []string{"--database-url", "postgres://alice:" + secret + "@127.0.0.1:99999999/db"}, "invalid database URL"},
		{"bad url", nil, []string{"--database-url", "postgres://alice:" + secret + "@[::1/db"}, "invalid database URL"},
		{"bad key-value", nil, []string{"--database-url", "host=localhost password=" + secret + " port=abc"}, "invalid database URL"},
		{"unreachable by flag", nil, []string{"--database-url", "postgres://alice:" + secret + "@127.0.0.1:" + port + "/db"}, "cannot connect"},
		{"unreachable by env", []string{"RELAY_DATABASE_URL=postgres://alice:" + secret + "@127.0.0.1:" + port + "/db"}, nil, "cannot connect"},
		{"unreachable by PG*", []string{"PGHOST=127.0.0.1", "PGPORT=" + port, "PGUSER=alice", "PGPASSWORD=" + secret}, nil, "cannot connect"},
	}
	for _, c := range cases {
		for _, sub := range []string{"up", "status"} {
			r := relay(t, c.env, append([]string{"migrate", sub}, c.args...)...)
			if r.Code == 0 {
				t.Errorf("%s, migrate %s: exit 0", c.name, sub)
			}
			out := r.Stdout + r.Stderr
			if strings.Contains(out, secret) {
				t.Errorf("%s, migrate %s: output shows the password: %q", c.name, sub, out)
			}
			if !strings.Contains(r.Stderr, c.want) || strings.Count(strings.TrimSpace(r.Stderr), "\n") != 0 || strings.Contains(out, "goroutine") {
				t.Errorf("%s, migrate %s: stderr %q; want one line containing %q", c.name, sub, r.Stderr, c.want)
			}
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	if r := relay(t, nil); r.Code != 2 || !strings.Contains(r.Stderr, "migrate") {
		t.Fatalf("no command: exit %d, %q", r.Code, r.Stderr)
	}
	if r := relay(t, nil, "nonsense"); r.Code != 2 || !strings.Contains(r.Stderr, "unknown command") {
		t.Fatalf("unknown command: exit %d, %q", r.Code, r.Stderr)
	}
	for _, dev := range []string{"demo", "bench"} {
		if r := relay(t, nil, dev); r.Code != 2 || !strings.Contains(r.Stderr, "go run ./cmd/relay-dev "+dev) {
			t.Fatalf("%s asked of the daemon: exit %d, %q; want a pointer to relay-dev", dev, r.Code, r.Stderr)
		}
	}
	if r := relay(t, nil, "migrate", "down", "--to", "-5"); r.Code != 2 {
		t.Fatalf("--to -5: exit %d, %q", r.Code, r.Stderr)
	}
	if r := relay(t, nil, "migrate", "up", "--schema", "Bad-Name"); r.Code != 1 || !strings.Contains(r.Stderr, "invalid schema name") {
		t.Fatalf("bad schema: exit %d, %q", r.Code, r.Stderr)
	}
	if r := relay(t, []string{"RELAY_DRY_RUN=maybe"}, "migrate", "up"); r.Code != 2 || !strings.Contains(r.Stderr, "RELAY_DRY_RUN") {
		t.Fatalf("bad env value: exit %d, %q", r.Code, r.Stderr)
	}
}
