package protocol

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// kafkajsMember runs testdata/kafkajs_group.js, a kafkajs group member,
// collecting what it prints.
type kafkajsMember struct {
	cmd *exec.Cmd

	mu     sync.Mutex
	seen   map[string]int
	errors []string
	joins  int
}

func startKafkajsMember(t *testing.T, addr, topic, group, clientID string) *kafkajsMember {
	t.Helper()
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node is required (.ci/run installs nodejs): %v", err)
	}
	modules, err := filepath.Abs("../../registry/testdata/clients/node_modules")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(modules, "kafkajs", "package.json")); err != nil {
		t.Fatalf("kafkajs is required (.ci/run: npm ci --prefix internal/registry/testdata/clients): %v", err)
	}
	m := &kafkajsMember{seen: map[string]int{}}
	m.cmd = exec.Command(node, "testdata/kafkajs_group.js", addr, topic, group, clientID)
	m.cmd.Env = append(os.Environ(), "NODE_PATH="+modules)
	out, err := m.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	m.cmd.Stderr = m.cmd.Stdout
	if err := m.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			m.mu.Lock()
			switch {
			case strings.HasPrefix(line, "record "):
				m.seen[strings.TrimPrefix(line, "record ")]++
			case strings.HasPrefix(line, "joined "):
				m.joins++
			case strings.HasPrefix(line, "error "):
				m.errors = append(m.errors, line)
			}
			m.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		_ = m.cmd.Process.Kill()
		_ = m.cmd.Wait()
		<-done
	})
	return m
}

func (m *kafkajsMember) joined() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.joins
}

// TestKafkajsGroupAcrossBrokerRestart: two kafkajs members of one classic
// group read and commit; the broker process is stopped and started again
// on its data directory; they go on without reading a committed record
// again, and their commits after the restart are accepted (the group's
// committed offsets reach the high watermark again).
func TestKafkajsGroupAcrossBrokerRestart(t *testing.T) {
	t.Parallel()
	ctx := testContext(t, 3*time.Minute)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := t.TempDir()
	p := startBrokerProcess(t, ctx, dir, addr)

	const topic, group, parts = "js-events", "js-group", 4
	// kafkajs decodes no snappy without a plugin: send uncompressed.
	admin := newKgo(t, addr, kgo.ProducerBatchCompression(kgo.NoCompression()))
	defer admin.Close()
	adm := kadm.NewClient(admin)
	if _, err := adm.CreateTopic(ctx, parts, 1, nil, topic); err != nil {
		t.Fatal(err)
	}
	produce := func(from, to int) {
		t.Helper()
		var rs []*kgo.Record
		for i := from; i < to; i++ {
			rs = append(rs, &kgo.Record{Topic: topic, Key: []byte(strconv.Itoa(i)), Value: []byte(strconv.Itoa(i))})
		}
		if err := admin.ProduceSync(ctx, rs...).FirstErr(); err != nil {
			t.Fatalf("produce: %v", err)
		}
	}
	members := []*kafkajsMember{
		startKafkajsMember(t, addr, topic, group, "js-a"),
		startKafkajsMember(t, addr, topic, group, "js-b"),
	}
	distinct := func() int {
		all := map[string]bool{}
		for _, m := range members {
			m.mu.Lock()
			if len(m.errors) > 0 {
				t.Fatalf("%s: %v", m.cmd.Args[len(m.cmd.Args)-1], m.errors)
			}
			for v := range m.seen {
				all[v] = true
			}
			m.mu.Unlock()
		}
		return len(all)
	}
	caughtUp := func() bool {
		offsets, err := adm.FetchOffsets(ctx, group)
		if err != nil {
			return false
		}
		ends, err := adm.ListEndOffsets(ctx, topic)
		if err != nil {
			return false
		}
		ok := true
		ends.Each(func(o kadm.ListedOffset) {
			c, found := offsets.Lookup(topic, o.Partition)
			if !found || c.At != o.Offset {
				ok = false
			}
		})
		return ok
	}
	waitFor(t, ctx, "both members in the group", func() bool { return members[0].joined() > 0 && members[1].joined() > 0 })
	produce(0, 400)
	waitFor(t, ctx, "400 records read", func() bool { return distinct() == 400 })
	waitFor(t, ctx, "commits at the high watermark", caughtUp)

	p.Signal(syscall.SIGTERM)
	if code := p.Wait(30 * time.Second); code != 0 {
		t.Fatalf("broker process exited %d: %s", code, p.Output())
	}
	startBrokerProcess(t, ctx, dir, addr)
	produce(400, 800)
	waitFor(t, ctx, "800 records read", func() bool { return distinct() == 800 })
	waitFor(t, ctx, "commits after the restart at the high watermark", caughtUp)

	for _, m := range members {
		m.mu.Lock()
		for v, n := range m.seen {
			if n > 1 {
				t.Errorf("%s read record %s %d times", m.cmd.Args[len(m.cmd.Args)-1], v, n)
			}
		}
		if len(m.errors) > 0 {
			t.Errorf("%s: %v", m.cmd.Args[len(m.cmd.Args)-1], m.errors)
		}
		m.mu.Unlock()
	}
	dup := 0
	all := map[string]int{}
	for _, m := range members {
		m.mu.Lock()
		for v, n := range m.seen {
			all[v] += n
		}
		m.mu.Unlock()
	}
	for v, n := range all {
		if n > 1 {
			dup++
			t.Errorf("record %s read %d times across the group", v, n)
		}
	}
	t.Logf("%d records, %d read more than once; joins: %d, %d", len(all), dup, members[0].joined(), members[1].joined())
}
