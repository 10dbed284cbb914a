package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/e2e"
)

// memberReport is what testdata/group_member.py writes when it ends.
type memberReport struct {
	Assigned     []float64      `json:"assigned"`
	Revoked      []float64      `json:"revoked"`
	CommitErrors [][]any        `json:"commit_errors"`
	IDs          map[string]int `json:"ids"`
	Closing      float64        `json:"closing"`
}

// TestGroupsSurviveARelayRestart: three members of one consumer group, of
// three client families (librdkafka through python3-confluent-kafka,
// kafka-python, and kafkajs from npm), read the log slowly through the Kafka
// listener, committing after each poll; the relay is stopped (SIGTERM) and
// started again, then SIGKILLed and started again, then partitioned from
// PostgreSQL so that a standby on the same data directory and Kafka
// address takes over (the old leader hands the directory over when the
// new one asks for it). The group's membership is durable: after the
// restarts and the takeover no member is assigned or revoked again, every
// commit once a relay is back is accepted, and no record is delivered
// twice to the group.
//
// franz-go members are not used here: franz-go ends its group session
// when a heartbeat cannot reach the coordinator, so it rejoins after any
// coordinator outage, and the leader's rejoin rebalances the group (in
// Kafka too); librdkafka keeps its assignment and retries.
func TestGroupsSurviveARelayRestart(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import confluent_kafka, kafka").CombinedOutput(); err != nil {
		t.Fatalf("a Python Kafka client is missing (apt-get install python3-confluent-kafka python3-kafka; .ci/run does): %v\n%s", err, out)
	}
	e := newEnv(t)
	n, kafkaAddr, _ := e.listenerWithEvents(15000, "--partitions", "6")

	script, _ := filepath.Abs("testdata/group_member.py")
	dir := t.TempDir()
	var procs []*exec.Cmd
	var outs []string
	node := filepath.Join("testdata", "clients", "node_modules", "kafkajs")
	if _, err := os.Stat(node); err != nil {
		t.Fatalf("kafkajs is missing (npm ci --prefix internal/faults/testdata/clients; .ci/run does): %v", err)
	}
	jsScript, _ := filepath.Abs("testdata/clients/group_member.js")
	for i, client := range []string{"librdkafka", "kafka-python", "kafkajs"} {
		out := filepath.Join(dir, fmt.Sprintf("member%d.json", i))
		cmd := exec.Command(python, script, client, kafkaAddr, "durable", "130", out)
		if client == "kafkajs" {
			cmd = exec.Command("node", jsScript, kafkaAddr, "durable", "130", out)
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		procs, outs = append(procs, cmd), append(outs, out)
	}
	adm, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		t.Fatal(err)
	}
	committed := func() int64 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		n, err := committedOffsets(ctx, adm, "durable", "")
		if err != nil {
			return 0
		}
		return n
	}
	waitFor(t, time.Minute, "the group to commit", func() bool { return committed() > 300 })
	time.Sleep(3 * time.Second) // deliberate pause: the group settles before the restarts
	settled := time.Now()
	var back []time.Time
	for _, how := range []string{"SIGTERM", "SIGKILL"} {
		before := committed()
		if how == "SIGTERM" {
			n.stop()
		} else {
			n.proc.Kill()
			n.proc.Wait(time.Minute)
		}
		n.start()
		e2e.WaitRole(t, n.proc, "leader", 30*time.Second)
		back = append(back, time.Now())
		waitFor(t, time.Minute, "commits to go on after the "+how+" restart", func() bool { return committed() > before+200 })
	}
	// Longer than the members' session timeout (30 s) before the
	// takeover: a coordinator that restored the group but saw none of its
	// heartbeats (the admin socket's) would have expired the members and
	// saved the group empty by now, and the takeover would rebalance it.
	time.Sleep(35 * time.Second) // deliberate pause: longer than the session timeout (see above)
	// The takeover: the leader loses PostgreSQL, the standby leads and
	// asks for the directory, the old leader closes its broker and
	// listener, the new one opens them on the same address.
	standby := e.newNode("standby", "--kafka-addr", kafkaAddr, "--partitions", "6")
	e2e.WaitRole(t, standby.start().proc, "standby", 30*time.Second)
	before := committed()
	n.proxy.Blackhole()
	waitFor(t, time.Minute, "the standby's pipeline to start", func() bool { return strings.Contains(standby.proc.Output(), "pipeline started") })
	back = append(back, time.Now())
	waitFor(t, time.Minute, "commits to go on after the takeover", func() bool { return committed() > before+200 })
	n.proxy.Heal()
	e2e.WaitRole(t, n.proc, "standby", 30*time.Second)
	adm.Close()
	for i, cmd := range procs {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("member %d: %v", i, err)
		}
	}
	n.stop()
	standby.stop()

	reports := make([]memberReport, len(outs))
	firstClose := math.Inf(1)
	for i, out := range outs {
		raw, err := os.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, &reports[i]); err != nil {
			t.Fatal(err)
		}
		firstClose = min(firstClose, reports[i].Closing)
	}
	// The members stop one after another; the first to leave rebalances
	// the others, which is not what is tested. Before it, nothing may
	// rebalance once the group settled.
	from := float64(settled.UnixNano()) / 1e9
	if last := float64(back[len(back)-1].UnixNano()) / 1e9; last+5 > firstClose {
		t.Fatalf("a member stopped %.1f s after the last restart: too soon to tell", firstClose-last)
	}
	all := map[string]int{}
	for i, r := range reports {
		for _, at := range r.Assigned {
			if at > from && at < firstClose {
				t.Errorf("member %d was assigned partitions again after the group settled: a rebalance", i)
			}
		}
		for _, at := range r.Revoked {
			if at > from && at < firstClose {
				t.Errorf("member %d had partitions revoked after the group settled", i)
			}
		}
		for _, ce := range r.CommitErrors {
			at, _ := ce[0].(float64)
			for _, b := range back {
				if at > float64(b.Add(time.Second).UnixNano())/1e9 && at < float64(b.Add(5*time.Second).UnixNano())/1e9 {
					t.Errorf("member %d: a commit after the relay was back was refused: %v", i, ce[1])
				}
			}
		}
		if len(r.Assigned) == 0 || len(r.IDs) == 0 {
			t.Errorf("member %d was assigned partitions %d times and read %d records: it took no part", i, len(r.Assigned), len(r.IDs))
		}
		for id, c := range r.IDs {
			all[id] += c
		}
	}
	twice := 0
	for _, c := range all {
		if c > 1 {
			twice++
		}
	}
	if twice > 0 {
		t.Errorf("%d of %d records were delivered to the group more than once", twice, len(all))
	}
	if len(all) < 1000 {
		t.Errorf("the group read only %d records", len(all))
	}
	t.Logf("%d records read by a librdkafka, a kafka-python and a kafkajs member across a SIGTERM and a SIGKILL restart of the relay and a takeover by a standby; %d delivered twice", len(all), twice)
}
