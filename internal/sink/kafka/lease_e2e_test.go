package kafka_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
	"github.com/outboxrelay/relay/internal/pgtest"
	"github.com/outboxrelay/relay/internal/sink/kafka/kafkatest"
	"github.com/outboxrelay/relay/relay"
)

// TestE2EKafkaLeaseKilled is issue 13's leadership acceptance for the Kafka
// sink: two relays (`relay run --sink kafka --leader-lease 1s`) on one
// outbox and one kfake cluster while 8 writers commit at least 20,000
// events over 400 keys (one transaction in 25 rolls back), across every
// round. Six times the leader's
// lease session is terminated (pg_terminate_backend): in rounds 0 and 3
// only that, and the leader reconnects and keeps its lease if it can; in
// rounds 1 and 4 with Postgres refusing new connections to the database,
// and in rounds 2 and 5 every session of the leader is terminated so, until
// the standby has taken over. Then:
//
//   - Kafka holds every committed event, nothing rolled back, first copies
//     in per-key commit order; at least once: repeats are counted;
//     transactional: a read_committed reader sees none;
//   - no two relays published at once: every sink session has its own
//     producer (an idempotent producer id, or the transactional id's
//     epoch), and in no partition does a producer's record come after the
//     first record of a later producer.
func TestE2EKafkaLeaseKilled(t *testing.T) {
	eachMode(t, leaseKilled)
}

func leaseKilled(t *testing.T, txn bool) {
	k := newKafkaRelay(t, "poll", transactionalID(txn, "relay-e2e-lease"), "--kafka-publish-timeout", "10s", "--kafka-dial-timeout", "3s", "--leader-lease", "1s")
	cfg, err := pgx.ParseConfig(k.url)
	if err != nil {
		t.Fatal(err)
	}
	dbName := cfg.Database
	db := pgx.Identifier{dbName}.Sanitize()
	ledger := e2e.NewLedger()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	// The test's own session is in another database: Postgres refuses to
	// disallow connections to the current one.
	cfg.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Close(context.Background()) })
	allow := func(yes bool) {
		t.Helper()
		if _, err := admin.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s WITH ALLOW_CONNECTIONS %v", db, yes)); err != nil {
			t.Fatalf("ALTER DATABASE ... ALLOW_CONNECTIONS %v: %v", yes, err)
		}
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), fmt.Sprintf("ALTER DATABASE %s WITH ALLOW_CONNECTIONS true", db))
	})

	procs := []*e2e.Proc{k.startAt(k.httpAddr)}
	e2e.WaitRole(t, procs[0], string(relay.RoleLeader), time.Minute)
	procs = append(procs, k.startAt(e2e.FreeAddr(t)))
	e2e.WaitRole(t, procs[1], string(relay.RoleStandby), time.Minute)

	began := time.Now()
	roundsDone := make(chan struct{})
	writeDone := make(chan error, 1)
	go func() { writeDone <- writeAcross(ctx, k.url, ledger, 20_000, roundsDone) }()
	watch := pgtest.Connect(t, k.url)
	rng := rand.New(rand.NewPCG(13, map[bool]uint64{false: 1, true: 2}[txn]))
	takeovers, terminated := 0, 0
	for round := range 6 {
		time.Sleep(time.Duration(300+rng.IntN(700)) * time.Millisecond) // deliberate pause: a random moment for the round's fault
		mode := round % 3
		var (
			epoch int64
			pid   int
			n     int
			ports []int32
		)
		// Under load a leader's lease session can be replaced between
		// the settling and the termination: the round settles again, up
		// to three times, before it counts as having terminated nothing.
		for try := 0; ; try++ {
			epoch, pid = settled(t, ctx, watch, procs)
			if mode > 0 {
				allow(false)
			}
			ports = clientPorts(t, pid, cfg.Port)
			q := `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
WHERE datname = $4 AND client_port = ANY($1) AND ($2 OR application_name = $3)`
			if err := admin.QueryRow(ctx, q, ports, mode == 2, relay.LeaseApplicationName, dbName).Scan(&n); err != nil {
				t.Fatalf("round %d: terminating the leader's sessions: %v", round, err)
			}
			if n > 0 || try == 2 {
				break
			}
			t.Logf("round %d: no session of the leader to terminate (its ports %v); settling again", round, ports)
			if mode > 0 {
				allow(true)
			}
		}
		terminated += n
		if n == 0 {
			t.Errorf("round %d: no session of the leader to terminate (its ports %v)", round, ports)
		}
		if mode > 0 {
			waitEpochAfter(t, ctx, watch, epoch)
			allow(true)
		}
		now, _, _ := leaderOf(t, ctx, watch, procs)
		if now != epoch {
			takeovers++
		}
		t.Logf("round %d: mode %d, %d sessions of the leader (pid %d, epoch %d) terminated, epoch now %d", round, mode, n, pid, epoch, now)
	}
	close(roundsDone)
	if err := <-writeDone; err != nil {
		t.Fatalf("writers: %v", err)
	}
	written := time.Since(began)
	e2e.WaitDrained(t, k.url, "outbox", 2*time.Minute)
	drained := time.Since(began)
	skips := 0
	for _, p := range procs {
		p.Stop(time.Minute)
		skips += strings.Count(p.Output(), logSkipped)
	}

	records := kafkatest.ReadRecords(t, k.cluster.Addrs(), "orders", txn)
	res := checkKafka(t, kafkatest.AsRecords(records), ledger, e2eParts)
	producers, handovers := checkOneProducerAtATime(t, records)
	t.Logf("%d committed events (%d rolled back absent); 6 rounds, %d sessions terminated, %d takeovers; writers done after %v, drained after %v",
		len(ledger.Committed), len(ledger.RolledBack), terminated, takeovers, written.Round(time.Millisecond), drained.Round(time.Millisecond))
	t.Logf("%d producers (sink sessions) wrote to the topic, the partitions changed producer %d times, no producer wrote after a later one; %v", producers, handovers, res)
	if takeovers < 4 {
		t.Errorf("%d takeovers, want at least the 4 forced ones", takeovers)
	}
	if handovers < e2eParts {
		t.Errorf("the partitions changed producer %d times: no handover between relays was checked", handovers)
	}
	if txn {
		t.Logf("exactly once: re-delivered committed events skipped %d times", skips)
		if res.dups > 0 {
			t.Errorf("%d duplicates for a read_committed reader in the transactional mode", res.dups)
		}
	}
}

// writeAcross runs 8 writers (400 keys, one transaction in 25 rolled
// back) in runs of 1,000 events until at least events are committed and
// rounds is closed. A run whose writers cannot connect (the database
// refusing connections during a round) is tried again; each writer keeps
// its connection for its run, so no commit is ever in doubt.
func writeAcross(ctx context.Context, url string, ledger *e2e.Ledger, events int, rounds <-chan struct{}) error {
	cfg := e2e.WriterConfig{URL: url, Schema: "outbox", Topic: "orders", Writers: 8, Events: 1000, Keys: 400,
		PerTx: 10, RollbackEvery: 25, PayloadBytes: 120}
	for {
		select {
		case <-rounds:
			if ledger.Len() >= events {
				return nil
			}
		default:
		}
		err := e2e.Write(ctx, cfg, ledger)
		var connect *pgconn.ConnectError
		if errors.As(err, &connect) {
			time.Sleep(50 * time.Millisecond) // retry backoff: PostgreSQL refused the connection
			continue
		}
		if err != nil {
			return err
		}
	}
}

// startAt starts a relay with k's arguments serving HTTP on addr.
func (k *kafkaRelay) startAt(addr string) *e2e.Proc {
	k.t.Helper()
	args := append([]string(nil), k.args...)
	for i := range args {
		if args[i] == "--http-addr" {
			args[i+1] = addr
		}
	}
	return e2e.Start(k.t, k.bin, nil, args...)
}

// leaderOf reads the leadership table: the current epoch, and the pid and
// process of its holder (host/pid/suffix).
func leaderOf(t *testing.T, ctx context.Context, conn *pgx.Conn, procs []*e2e.Proc) (epoch int64, pid int, p *e2e.Proc) {
	t.Helper()
	var holder string
	if err := conn.QueryRow(ctx, "SELECT epoch, holder FROM outbox.leadership").Scan(&epoch, &holder); err != nil {
		t.Fatalf("reading the leadership: %v", err)
	}
	parts := strings.Split(holder, "/")
	if len(parts) < 3 {
		t.Fatalf("leadership holder %q is not host/pid/suffix", holder)
	}
	pid, err := strconv.Atoi(parts[len(parts)-2])
	if err != nil {
		t.Fatalf("leadership holder %q: %v", holder, err)
	}
	for _, p := range procs {
		if pidServing(t, p.HTTPAddr) == pid {
			return epoch, pid, p
		}
	}
	t.Fatalf("the leader, pid %d, is none of the test's relays", pid)
	return 0, 0, nil
}

// settled waits until the holder of the current epoch is ready (its
// pipeline runs: an elected relay whose pipeline failed is replaced after
// its lease) and has a lease session, and the other relay waits as a standby with a lease session
// (a relay that failed to connect while connections were refused retries
// after a backoff), so that a round can force a takeover. It returns the
// epoch and the holder's pid.
func settled(t *testing.T, ctx context.Context, conn *pgx.Conn, procs []*e2e.Proc) (epoch int64, pid int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		epoch, pid, p := leaderOf(t, ctx, conn, procs)
		ready, _ := p.Ready()
		leasing := func(pid int) bool {
			var n int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND client_port = ANY($2)`,
				relay.LeaseApplicationName, clientPorts(t, pid, conn.Config().Port)).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n > 0
		}
		// A leader whose lease session was just terminated (rounds 0 and
		// 3) leads on while it reconnects: the round waits for the new
		// session, which is the one it terminates.
		leaderLease := leasing(pid)
		standby := false
		for _, o := range procs {
			if o == p || o.Role() != string(relay.RoleStandby) {
				continue
			}
			standby = leasing(pidServing(t, o.HTTPAddr))
		}
		if ready && leaderLease && standby {
			return epoch, pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled after a minute: the holder of epoch %d (pid %d) ready %v with a lease session %v, a standby with a lease session %v", epoch, pid, ready, leaderLease, standby)
		}
		time.Sleep(50 * time.Millisecond) // condition poll
	}
}

// waitEpochAfter waits until a takeover committed an epoch after epoch.
func waitEpochAfter(t *testing.T, ctx context.Context, conn *pgx.Conn, epoch int64) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var now int64
		if err := conn.QueryRow(ctx, "SELECT epoch FROM outbox.leadership").Scan(&now); err != nil {
			t.Fatalf("reading the leadership: %v", err)
		}
		if now > epoch {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no takeover after epoch %d within a minute", epoch)
		}
		time.Sleep(20 * time.Millisecond) // condition poll
	}
}

// clientPorts returns the local TCP ports of process pid's sockets
// connected to Postgres at pgPort (Linux): pg_stat_activity's client_port
// of its sessions.
func clientPorts(t *testing.T, pid int, pgPort uint16) []int32 {
	t.Helper()
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("reading the relay's descriptors: %v", err)
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err == nil && strings.HasPrefix(link, "socket:[") {
			inodes[strings.TrimSuffix(strings.TrimPrefix(link, "socket:["), "]")] = true
		}
	}
	var ports []int32
	for _, table := range []string{"tcp", "tcp6"} {
		f, err := os.Open(fmt.Sprintf("/proc/%d/net/%s", pid, table))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !inodes[fields[9]] {
				continue
			}
			// Linux reuses an ephemeral port for connections to other
			// destinations: only sockets connected to Postgres count.
			_, remote, _ := strings.Cut(fields[2], ":")
			if r, err := strconv.ParseUint(remote, 16, 16); err != nil || uint16(r) != pgPort {
				continue
			}
			_, port, ok := strings.Cut(fields[1], ":")
			if n, err := strconv.ParseInt(port, 16, 32); ok && err == nil {
				ports = append(ports, int32(n))
			}
		}
		f.Close()
	}
	return ports
}

// pidServing finds the relay process whose command line has
// --http-addr addr.
func pidServing(t *testing.T, addr string) int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(string(cmdline), "\x00")
		for i := 0; i+1 < len(args); i++ {
			if args[i] == "--http-addr" && args[i+1] == addr && strings.Contains(strings.Join(args, " "), "--sink kafka") {
				return pid
			}
		}
	}
	t.Fatalf("no relay process serves %s", addr)
	return 0
}

// checkOneProducerAtATime asserts that in each partition (records sorted by
// partition and offset) every producer's records are contiguous: no
// producer (id and epoch: one sink session of the at-least-once mode; in
// the transactional mode the epoch moves on with every transaction, KIP-890,
// so each transaction counts as one) writes again once a later one has
// written. It returns how many producers wrote, and how many times a
// partition changed producer.
func checkOneProducerAtATime(t *testing.T, records []*kgo.Record) (producers, handovers int) {
	t.Helper()
	type producer struct {
		id    int64
		epoch int16
	}
	all := map[producer]bool{}
	bad := 0
	var part int32 = -1
	var cur producer
	var done map[producer]int64
	for _, r := range records {
		p := producer{r.ProducerID, r.ProducerEpoch}
		all[p] = true
		if r.Partition != part {
			part, cur, done = r.Partition, p, map[producer]int64{}
			continue
		}
		if p == cur {
			continue
		}
		if until, ok := done[p]; ok {
			bad++
			if bad <= 10 {
				t.Errorf("partition %d offset %d: producer %d/%d writes again after producer %d/%d took over (its run ended at offset %d)",
					r.Partition, r.Offset, p.id, p.epoch, cur.id, cur.epoch, until)
			}
		}
		done[cur] = r.Offset - 1
		cur = p
		handovers++
	}
	if bad > 0 {
		t.Errorf("%d records written by a producer after a later producer's first record in their partition: two relays published at once", bad)
	}
	return len(all), handovers
}
