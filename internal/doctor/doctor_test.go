package doctor_test

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/doctor"
	"github.com/outboxrelay/relay/internal/pgcluster"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/internal/testbin"
)

func TestMain(m *testing.M) { pgtest.Main(m, testbin.Cleanup) }

// config is a Config of the embedded sink on url, with listeners on free
// addresses and a fresh data directory.
func config(t *testing.T, url, source string) doctor.Config {
	return doctor.Config{DatabaseURL: url, Schema: "outbox", Source: source, Sink: "embedded",
		DataDir: t.TempDir(), KafkaAddr: freeAddr(t), HTTPAddr: freeAddr(t)}
}

func freeAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

func run(t *testing.T, cfg doctor.Config) map[string]doctor.Result {
	t.Helper()
	d := doctor.New(cfg)
	defer d.Close(context.Background())
	out := map[string]doctor.Result{}
	for _, r := range d.Run(context.Background()) {
		out[r.Check] = r
	}
	return out
}

// expect checks that r has status and that its detail and fix hold each
// of words.
func expect(t *testing.T, r doctor.Result, status doctor.Status, words ...string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("%s: %s (%s; fix: %s), want %s", r.Check, r.Status, r.Detail, r.Fix, status)
		return
	}
	for _, w := range words {
		if !strings.Contains(r.Detail+" fix: "+r.Fix, w) {
			t.Errorf("%s: %q (fix %q) does not say %q", r.Check, r.Detail, r.Fix, w)
		}
	}
}

// TestMigratedDatabasePasses: against the test server, migrated, every
// check of both readers passes.
func TestMigratedDatabasePasses(t *testing.T) {
	url, _ := pgtest.MigratedDatabase(t, "outbox")
	for _, source := range []string{"poll", "cdc"} {
		rs := run(t, config(t, url, source))
		want := 8
		if source == "cdc" {
			want += 6
		}
		if len(rs) != want {
			t.Errorf("%s: %d checks ran, want %d: %v", source, len(rs), want, rs)
		}
		for _, r := range rs {
			if r.Status != doctor.Pass {
				t.Errorf("%s: %s: %s (%s; fix: %s)", source, r.Check, r.Status, r.Detail, r.Fix)
			}
		}
	}
}

// TestSchemaVersions: a database without the outbox schema, one with a
// pending migration and one migrated by a newer relay each fail the
// schema check with their fix; a newer migration that records this relay
// as compatible is a warning.
func TestSchemaVersions(t *testing.T) {
	empty := pgtest.NewDatabase(t)
	expect(t, run(t, config(t, empty, "poll"))["schema"], doctor.Fail, "relay migrate up", "version 0")

	url, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	var latest int
	if err := conn.QueryRow(ctx, "DELETE FROM outbox.schema_migrations WHERE version = (SELECT max(version) FROM outbox.schema_migrations) RETURNING version").Scan(&latest); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, config(t, url, "poll"))["schema"], doctor.Fail, "relay migrate up", fmt.Sprintf("needs %d", latest))

	if _, err := conn.Exec(ctx, "INSERT INTO outbox.schema_migrations (version, name) VALUES ($1, 'x'), ($1 + 1, 'future')", latest); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, config(t, url, "poll"))["schema"], doctor.Fail, "this relay is older than the schema", "relay migrate down")

	if _, err := conn.Exec(ctx, "UPDATE outbox.schema_migrations SET compatible_from = $1 WHERE version = $1 + 1", latest); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, config(t, url, "poll"))["schema"], doctor.Warn, "keep this relay compatible", "docs/upgrading.md")
}

// TestRoleWithoutRights: a role without REPLICATION fails the cdc role
// check, and one without grants on the outbox fails the privileges check
// until granted them.
func TestRoleWithoutRights(t *testing.T) {
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	role := fmt.Sprintf("doctor_plain_%d", os.Getpid())
	if _, err := conn.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'pw'"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Exec(context.Background(), "DROP OWNED BY "+role)
		conn.Exec(context.Background(), "DROP ROLE "+role)
	})
	u, err := urlAs(url, role)
	if err != nil {
		t.Fatal(err)
	}
	rs := run(t, config(t, u, "cdc"))
	expect(t, rs["replication-role"], doctor.Fail, `ALTER ROLE "`+role+`" REPLICATION`, "--source poll")
	expect(t, rs["privileges"], doctor.Fail, `GRANT USAGE ON SCHEMA "outbox"`)
	expect(t, rs["publication"], doctor.Fail, "CREATE PUBLICATION relay_outbox")

	if _, err := conn.Exec(ctx, "GRANT USAGE ON SCHEMA outbox TO "+role+"; GRANT SELECT ON ALL TABLES IN SCHEMA outbox TO "+role); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, config(t, u, "poll"))["privileges"], doctor.Fail, `"outbox"."events" (DELETE)`, `GRANT INSERT, DELETE ON "outbox"."poll_ticks"`)

	if _, err := conn.Exec(ctx, "GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA outbox TO "+role+"; ALTER ROLE "+role+" REPLICATION"); err != nil {
		t.Fatal(err)
	}
	rs = run(t, config(t, u, "cdc"))
	expect(t, rs["privileges"], doctor.Pass)
	expect(t, rs["replication-role"], doctor.Pass, "REPLICATION")
}

func urlAs(raw, user string) (string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return "", err
	}
	u.User = url.UserPassword(user, "pw")
	return u.String(), nil
}

// TestSlots: a slot of the reader's name that is not a logical pgoutput
// slot fails; an invalidated one fails; a missing one passes.
func TestSlots(t *testing.T) {
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	cfg := config(t, url, "cdc")
	cfg.Slot = fmt.Sprintf("doctor_slot_%d", os.Getpid())
	expect(t, run(t, cfg)["slot"], doctor.Pass, "missing")
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1)", cfg.Slot); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Exec(context.Background(), "SELECT pg_drop_replication_slot($1)", cfg.Slot) })
	expect(t, run(t, cfg)["slot"], doctor.Fail, "physical", "pg_drop_replication_slot")
}

// TestWALLevelReplica: against a server with wal_level = replica, the cdc
// checks fail naming wal_level and the fix, a slot the server invalidated
// fails, and `relay doctor --source cdc`, the real binary, exits 1 saying
// so.
func TestWALLevelReplica(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, pgcluster.Options{Settings: map[string]string{"wal_level": "replica", "max_slot_wal_keep_size": "1MB"}})
	if err != nil {
		t.Fatalf("starting a server with wal_level = replica: %v", err)
	}
	t.Cleanup(func() { c.Stop(context.Background()) })
	conn, err := pgx.Connect(ctx, c.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	pgtest.Migrate(t, conn, "outbox")

	cfg := config(t, c.URL(), "cdc")
	expect(t, run(t, cfg)["wal_level"], doctor.Fail, "wal_level = replica", "ALTER SYSTEM SET wal_level = logical")

	// A slot the server invalidates (max_slot_wal_keep_size exceeded)
	// fails the slot check.
	cfg.Slot = "doctor_lost"
	if _, err := conn.Exec(ctx, "SELECT pg_create_physical_replication_slot($1, true)", cfg.Slot); err != nil {
		t.Fatal(err)
	}
	lost := ""
	for i := 0; i < 10 && lost != "lost"; i++ {
		if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS doctor_wal (b text); INSERT INTO doctor_wal SELECT repeat('x', 1000) FROM generate_series(1, 2000)"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "SELECT pg_switch_wal()"); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, "CHECKPOINT"); err != nil {
			t.Fatal(err)
		}
		if err := conn.QueryRow(ctx, "SELECT coalesce(wal_status, '') FROM pg_replication_slots WHERE slot_name = $1", cfg.Slot).Scan(&lost); err != nil {
			t.Fatal(err)
		}
	}
	if lost != "lost" {
		t.Fatalf("the slot's wal_status is %q after ten WAL segments past max_slot_wal_keep_size", lost)
	}
	d := doctor.New(cfg)
	defer d.Close(ctx)
	expect(t, d.Slot(ctx), doctor.Fail, "wal_status = lost", "max_slot_wal_keep_size")
	cfg.Slot = ""

	res, err := testbin.Run(ctx, testbin.Relay(t), nil, "doctor", "--source", "cdc", "--database-url", c.URL(),
		"--data-dir", cfg.DataDir, "--kafka-addr", cfg.KafkaAddr, "--http-addr", cfg.HTTPAddr)
	if err != nil {
		t.Fatal(err)
	}
	if res.Code != 1 {
		t.Errorf("relay doctor exited %d, want 1\n%s%s", res.Code, res.Stdout, res.Stderr)
	}
	for _, want := range []string{"FAIL  wal_level", "wal_level = logical", "PASS  schema", "1 of 14 checks failed"} {
		if !strings.Contains(res.Stdout, want) {
			t.Errorf("relay doctor's output does not say %q:\n%s", want, res.Stdout)
		}
	}
	if strings.Contains(res.Stdout+res.Stderr, "goroutine ") {
		t.Errorf("relay doctor panicked:\n%s", res.Stderr)
	}
}

// TestDataDirLockHeld: a data directory whose broker is open elsewhere
// fails the lock check, naming the holder's PID.
func TestDataDirLockHeld(t *testing.T) {
	cfg := config(t, pgtest.NewDatabase(t), "poll")
	d := doctor.New(cfg)
	defer d.Close(context.Background())
	expect(t, d.DataDirLock(context.Background()), doctor.Pass)
	b, err := broker.Open(context.Background(), broker.Options{Dir: cfg.DataDir})
	if err != nil {
		t.Fatal(err)
	}
	expect(t, d.DataDirLock(context.Background()), doctor.Fail, "held by PID "+fmt.Sprint(os.Getpid()), "its own --data-dir")
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	expect(t, d.DataDirLock(context.Background()), doctor.Pass)
}

// TestDataDirNotWritable: a data directory under a file cannot be created.
func TestDataDirNotWritable(t *testing.T) {
	file := t.TempDir() + "/file"
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config(t, "", "poll")
	cfg.DataDir = file + "/data"
	d := doctor.New(cfg)
	expect(t, d.DataDir(context.Background()), doctor.Fail, "is not a directory")
}

// TestListenerAddressInUse: an address another socket listens on fails
// the listener checks with "address in use" and the holder.
func TestListenerAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := config(t, "", "poll")
	cfg.KafkaAddr, cfg.HTTPAddr = taken.Addr().String(), taken.Addr().String()
	d := doctor.New(cfg)
	expect(t, d.KafkaListener(context.Background()), doctor.Fail, "address in use", "PID "+fmt.Sprint(os.Getpid()), "--kafka-addr")
	expect(t, d.HTTPListener(context.Background()), doctor.Fail, "address in use", "--http-addr")
	taken.Close()
	expect(t, d.KafkaListener(context.Background()), doctor.Pass)
}

// TestKafkaSink: brokers that do not answer fail; a running cluster
// passes; a topic waiting in the outbox fails while missing, passes when
// the sink may create it, and passes once present.
func TestKafkaSink(t *testing.T) {
	url, conn := pgtest.MigratedDatabase(t, "outbox")
	ctx := context.Background()
	cfg := config(t, url, "poll")
	cfg.Sink = "kafka"
	cfg.Timeout = 2 * time.Second
	cfg.Kafka = kafka.Config{Brokers: []string{freeAddr(t)}}.WithDefaults()
	rs := run(t, cfg)
	expect(t, rs["kafka-brokers"], doctor.Fail, "do not answer", "--kafka-brokers")
	expect(t, rs["kafka-topics"], doctor.Skip, "do not answer")
	if _, ok := rs["data-dir"]; ok {
		t.Error("the data directory was checked with --sink kafka")
	}

	cluster := kafkatest.Start(t)
	cfg.Kafka = kafka.Config{Brokers: cluster.Addrs()}.WithDefaults()
	rs = run(t, cfg)
	expect(t, rs["kafka-brokers"], doctor.Pass, "1 brokers")
	expect(t, rs["kafka-topics"], doctor.Pass, "no topic to check")

	if _, err := conn.Exec(ctx, "SELECT outbox.emit('doctor.orders', 'k', 'v')"); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, cfg)["kafka-topics"], doctor.Fail, "doctor.orders is missing", "--kafka-create-topics")
	cfg.Kafka.CreateTopics = true
	expect(t, run(t, cfg)["kafka-topics"], doctor.Pass, "creatable on first use: doctor.orders")
	cfg.Kafka.CreateTopics = false
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.Addrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if _, err := kadm.NewClient(cl).CreateTopic(ctx, 1, 1, nil, "doctor.orders"); err != nil {
		t.Fatal(err)
	}
	expect(t, run(t, cfg)["kafka-topics"], doctor.Pass, "present and writable: doctor.orders")
}

// TestUnreachablePostgresNamesNoSecret: a server that does not answer
// fails the postgres check, skips those that need it, and the report
// holds no password.
func TestUnreachablePostgresNamesNoSecret(t *testing.T) {
	cfg := config(t, "postgres://relay:s3cretPassw0rd@"+freeAddr(t)+"/app", "cdc")
	d := doctor.New(cfg)
	defer d.Close(context.Background())
	rs := d.Run(context.Background())
	var out strings.Builder
	doctor.Print(&out, rs)
	if err := doctor.PrintJSON(&out, "v0", rs); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), "s3cretPassw0rd") {
		t.Errorf("the report names the password:\n%s", out.String())
	}
	byName := map[string]doctor.Result{}
	for _, r := range rs {
		byName[r.Check] = r
	}
	expect(t, byName["postgres"], doctor.Fail, "cannot connect", "--database-url")
	expect(t, byName["wal_level"], doctor.Skip, "not reachable")
	if doctor.Failed(rs) != 1 {
		t.Errorf("%d failures, want the postgres check's only:\n%s", doctor.Failed(rs), out.String())
	}
}
