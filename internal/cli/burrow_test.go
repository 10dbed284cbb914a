package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// burrowConfig is Burrow's configuration for one relay: its kafka cluster
// module reads topic end offsets and its kafka consumer module reads
// committed offsets from __consumer_offsets, from the start.
const burrowConfig = `[general]
pidfile=%[1]q
[logging]
level="info"
[zookeeper]
servers=[%[2]q]
root-path="/burrow"
[client-profile.relay]
client-id="burrow"
kafka-version="2.0.0"
[cluster.relay]
class-name="kafka"
servers=[%[3]q]
client-profile="relay"
topic-refresh=1
offset-refresh=1
[consumer.relay]
class-name="kafka"
cluster="relay"
servers=[%[3]q]
client-profile="relay"
start-latest=false
[httpserver.default]
address=%[4]q
[storage.default]
class-name="inmemory"
intervals=10
min-distance=1
`

// burrowLagCheck runs LinkedIn's Burrow (the Debian package's binary)
// against the relay at kafkaAddr until it reports the lag of group on
// topic: once Burrow knows the topic's end offsets, group commits half of
// each partition's end offset, and Burrow must report every partition
// with that committed offset and the rest as its lag. Burrow is stopped
// with SIGTERM before it returns.
func burrowLagCheck(ctx context.Context, burrow, dir, zkAddr, kafkaAddr, httpAddr, topic, group string) (string, error) {
	conf := fmt.Sprintf(burrowConfig, filepath.Join(dir, "burrow.pid"), zkAddr, kafkaAddr, httpAddr)
	if err := os.WriteFile(filepath.Join(dir, "burrow.toml"), []byte(conf), 0o600); err != nil {
		return "", err
	}
	cmd := exec.Command(burrow, "-config-dir", dir)
	var out lockedBuffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		return "", err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	}()
	fail := func(err error) (string, error) {
		return "", fmt.Errorf("%w\nBurrow's log:\n%s", err, out.String())
	}
	get := func(path string, v any) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+httpAddr+path, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", path, resp.Status)
		}
		return json.NewDecoder(resp.Body).Decode(v)
	}
	// poll calls try every 100ms until it reports done, Burrow exits or
	// ctx ends.
	poll := func(what string, try func() (bool, error)) error {
		var last error
		for {
			done, err := try()
			if done {
				return nil
			}
			last = err
			select {
			case err := <-exited:
				exited <- err
				return fmt.Errorf("burrow exited (%v) waiting for %s", err, what)
			case <-ctx.Done():
				return fmt.Errorf("waiting for %s: %w (last: %v)", what, ctx.Err(), last)
			case <-time.After(100 * time.Millisecond):
			}
		}
	}

	var ends struct {
		Offsets []int64 `json:"offsets"`
	}
	if err := poll("Burrow to list "+topic+"'s end offsets", func() (bool, error) {
		err := get("/v3/kafka/relay/topic/"+topic, &ends)
		return err == nil && len(ends.Offsets) > 0, err
	}); err != nil {
		return fail(err)
	}

	cl, err := kgo.NewClient(kgo.SeedBrokers(kafkaAddr))
	if err != nil {
		return "", err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	listed, err := adm.ListEndOffsets(ctx, topic)
	if err != nil {
		return "", err
	}
	commits := kadm.Offsets{}
	wantLag := map[int32]int64{}
	committed := map[int32]int64{}
	var total int64
	listed.Each(func(o kadm.ListedOffset) {
		at := o.Offset / 2
		commits.Add(kadm.Offset{Topic: topic, Partition: o.Partition, At: at, LeaderEpoch: -1})
		committed[o.Partition], wantLag[o.Partition] = at, o.Offset-at
		total += o.Offset - at
	})
	if r, err := adm.CommitOffsets(ctx, group, commits); err != nil || r.Error() != nil {
		return "", fmt.Errorf("commit: %v %v", err, r.Error())
	}

	type burrowPartition struct {
		Topic      string `json:"topic"`
		Partition  int32  `json:"partition"`
		CurrentLag int64  `json:"current_lag"`
		End        *struct {
			Offset int64 `json:"offset"`
		} `json:"end"`
	}
	var lag struct {
		Status struct {
			Group          string            `json:"group"`
			PartitionCount int               `json:"partition_count"`
			TotalLag       int64             `json:"totallag"`
			Partitions     []burrowPartition `json:"partitions"`
		} `json:"status"`
	}
	var mismatch string
	if err := poll("Burrow to report "+group+"'s lag", func() (bool, error) {
		lag.Status.Partitions = nil
		if err := get("/v3/kafka/relay/consumer/"+group+"/lag", &lag); err != nil {
			return false, err
		}
		var bad []string
		for _, p := range lag.Status.Partitions {
			if p.Topic != topic || p.End == nil || p.End.Offset != committed[p.Partition] || p.CurrentLag != wantLag[p.Partition] {
				bad = append(bad, fmt.Sprintf("%+v", p))
			}
		}
		mismatch = strings.Join(bad, ", ")
		return len(bad) == 0 && len(lag.Status.Partitions) == len(committed) && lag.Status.TotalLag == total, nil
	}); err != nil {
		return fail(fmt.Errorf("%w; Burrow reported %d of %d partitions, total lag %d (want %d), off: %s",
			err, len(lag.Status.Partitions), len(committed), lag.Status.TotalLag, total, mismatch))
	}
	return fmt.Sprintf("group %s: every partition's committed offset and lag", lag.Status.Group), nil
}

// lockedBuffer collects a process's output from its copying goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
