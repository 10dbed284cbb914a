package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/outboxrelay/relay/internal/broker"
)

// `relay topics create | alter | describe | delete` change the embedded
// broker's topics: through the running daemon's admin socket (a Unix
// socket in its data directory, speaking the Kafka protocol, so the
// daemon's own broker does the work and its sink sees the change), or,
// when no daemon serves it, by opening the data directory itself.

func topicAdminCommands() []*command {
	return []*command{
		{name: "create", summary: "create a topic: relay topics create NAME [--partitions N] [--config k=v ...]", run: topicsCreate},
		{name: "alter", summary: "change a topic: relay topics alter NAME [--config k=v ...] [--delete-config k ...] [--partitions N --allow-repartition]", run: topicsAlter},
		{name: "describe", summary: "print a topic's configs and offsets: relay topics describe NAME", run: topicsDescribe},
		{name: "delete", summary: "delete a topic and its records: relay topics delete NAME", run: topicsDelete},
	}
}

// listFlag is a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type topicAdminFlags struct {
	dataDir string
	name    string
}

// parseTopicAdmin registers --data-dir, parses args (the topic name
// first or last), runs check (the command's own flags, nil: none) and
// opens the store.
func parseTopicAdmin(ctx context.Context, stdio IO, fs *flag.FlagSet, args []string, check func() error) (topicStore, string, error) {
	dataDir := fs.String("data-dir", "relay-data", "embedded broker data directory (the running daemon's, reached through its admin socket, or a stopped one's files)")
	var name string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	if err := parse(fs, args, stdio, true); err != nil {
		return nil, "", err
	}
	switch {
	case name == "" && fs.NArg() == 1:
		name = fs.Arg(0)
	case name == "" || fs.NArg() > 0:
		return nil, "", usagef("name one topic")
	}
	if err := broker.ValidateTopicName(name); err != nil {
		return nil, "", usagef("%v", err)
	}
	if check != nil {
		if err := check(); err != nil {
			return nil, "", err
		}
	}
	st, err := openTopicStore(ctx, *dataDir, fs.Name() == "relay topics create")
	return st, name, err
}

type topicDescription struct {
	Name       string            `json:"name"`
	Partitions []partitionJSON   `json:"partitions"`
	Configs    map[string]string `json:"configs"`
}

// topicStore is where the topic commands act: the daemon or the files.
type topicStore interface {
	create(ctx context.Context, name string, partitions int32, configs map[string]string) error
	alter(ctx context.Context, name string, set map[string]string, del []string) error
	// movement is the report of the keys a count of to would move.
	movement(ctx context.Context, name string, to int32) (string, error)
	grow(ctx context.Context, name string, to int32) error
	describe(ctx context.Context, name string) (topicDescription, error)
	remove(ctx context.Context, name string) error
	close()
	where() string
}

func openTopicStore(ctx context.Context, dataDir string, creating bool) (topicStore, error) {
	sock := filepath.Join(dataDir, adminSocket)
	if c, err := net.Dial("unix", sock); err == nil {
		c.Close()
		cl, err := kgo.NewClient(kgo.SeedBrokers("relay-admin:9"), kgo.Dialer(func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		}))
		if err != nil {
			return nil, err
		}
		return &daemonStore{cl: cl, adm: kadm.NewClient(cl), sock: sock}, nil
	}
	if _, err := os.Stat(filepath.Join(dataDir, "meta.json")); err != nil && !creating {
		return nil, fmt.Errorf("no running relay serves %s and %s holds no broker data: %w", sock, dataDir, err)
	}
	b, err := broker.Open(ctx, broker.Options{Dir: dataDir, JanitorInterval: -1, ScrubBytesPerSecond: -1, ReopenInterval: -1,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, fmt.Errorf("no running relay serves %s, and opening the data directory failed: %w", sock, err)
	}
	return &filesStore{b: b, dir: dataDir}, nil
}

func parseConfigs(kvs []string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, usagef("--config %q: want name=value", kv)
		}
		if _, known := broker.FindTopicConfig(k); !known {
			return nil, usagef("--config %s: unknown topic config", k)
		}
		out[k] = v
	}
	return out, nil
}

func topicsCreate(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay topics create", stdio)
	partitions := fs.Int("partitions", 0, "partition count (default: the running daemon's --partitions; required on a stopped one's files)")
	var configs listFlag
	fs.Var(&configs, "config", "topic config as name=value (repeatable), e.g. retention.ms=86400000")
	var cm map[string]string
	st, name, err := parseTopicAdmin(ctx, stdio, fs, args, func() (err error) {
		cm, err = parseConfigs(configs)
		return err
	})
	if err != nil {
		return err
	}
	defer st.close()
	if err := st.create(ctx, name, int32(*partitions), cm); err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stdout, "created topic %s (%s)\n", name, st.where())
	return nil
}

func topicsAlter(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay topics alter", stdio)
	partitions := fs.Int("partitions", 0, "raise the partition count to this (a migration: keys move; needs --allow-repartition)")
	allow := fs.Bool("allow-repartition", false, "confirm the partition increase after reading its report")
	var set, del listFlag
	fs.Var(&set, "config", "set a topic config, name=value (repeatable)")
	fs.Var(&del, "delete-config", "put a topic config back to its default (repeatable)")
	var cm map[string]string
	st, name, err := parseTopicAdmin(ctx, stdio, fs, args, func() (err error) {
		if cm, err = parseConfigs(set); err != nil {
			return err
		}
		for _, k := range del {
			if _, ok := broker.FindTopicConfig(k); !ok {
				return usagef("--delete-config %s: unknown topic config", k)
			}
		}
		if *partitions == 0 && len(cm) == 0 && len(del) == 0 {
			return usagef("nothing to alter: give --config, --delete-config or --partitions")
		}
		return nil
	})
	if err != nil {
		return err
	}
	defer st.close()
	if *partitions != 0 {
		report, err := st.movement(ctx, name, int32(*partitions))
		if err != nil {
			return err
		}
		fmt.Fprintln(stdio.Stdout, report)
		if !*allow {
			return errors.New("a partition increase is a migration: read the report above and the procedure in docs/topics.md, then run again with --allow-repartition")
		}
		if err := st.grow(ctx, name, int32(*partitions)); err != nil {
			return err
		}
		fmt.Fprintf(stdio.Stdout, "topic %s now has %d partitions (%s)\n", name, *partitions, st.where())
	}
	if len(cm) > 0 || len(del) > 0 {
		if err := st.alter(ctx, name, cm, del); err != nil {
			return err
		}
		fmt.Fprintf(stdio.Stdout, "altered topic %s (%s)\n", name, st.where())
	}
	return nil
}

func topicsDescribe(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay topics describe", stdio)
	asJSON := fs.Bool("json", false, "print JSON")
	st, name, err := parseTopicAdmin(ctx, stdio, fs, args, nil)
	if err != nil {
		return err
	}
	defer st.close()
	d, err := st.describe(ctx, name)
	if err != nil {
		return err
	}
	if *asJSON {
		return writeJSON(stdio.Stdout, d)
	}
	fmt.Fprintf(stdio.Stdout, "topic %s: %d partitions\n", d.Name, len(d.Partitions))
	names := make([]string, 0, len(d.Configs))
	for k := range d.Configs {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(stdio.Stdout, "  %s=%s\n", k, d.Configs[k])
	}
	tw := tabwriter.NewWriter(stdio.Stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "PARTITION\tSTART\tEND\t")
	for _, p := range d.Partitions {
		fmt.Fprintf(tw, "%d\t%d\t%d\t\n", p.Partition, p.StartOffset, p.EndOffset)
	}
	return tw.Flush()
}

func topicsDelete(ctx context.Context, stdio IO, args []string) error {
	fs := flagSet("relay topics delete", stdio)
	st, name, err := parseTopicAdmin(ctx, stdio, fs, args, nil)
	if err != nil {
		return err
	}
	defer st.close()
	if err := st.remove(ctx, name); err != nil {
		return err
	}
	fmt.Fprintf(stdio.Stdout, "deleted topic %s (%s)\n", name, st.where())
	return nil
}

// filesStore acts on a stopped relay's data directory.
type filesStore struct {
	b   *broker.Broker
	dir string
}

func (s *filesStore) where() string { return "in " + s.dir }
func (s *filesStore) close()        { _ = s.b.Close() }

func (s *filesStore) create(_ context.Context, name string, partitions int32, configs map[string]string) error {
	if partitions <= 0 {
		return usagef("--partitions is required on a stopped relay's files")
	}
	cfg := broker.TopicConfig{Partitions: partitions}
	for k, v := range configs {
		if err := broker.SetTopicConfig(&cfg, k, v); err != nil {
			return err
		}
	}
	_, err := s.b.CreateTopic(name, cfg)
	return err
}

func (s *filesStore) alter(_ context.Context, name string, set map[string]string, del []string) error {
	ti, err := s.b.Topic(name)
	if err != nil {
		return err
	}
	cfg, defaults := ti.Config, s.b.DefaultTopicConfig()
	for _, k := range del {
		f, ok := broker.FindTopicConfig(k)
		if !ok {
			return usagef("--delete-config %s: unknown topic config", k)
		}
		if err := f.Set(&cfg, f.Get(defaults)); err != nil {
			return err
		}
	}
	for k, v := range set {
		if err := broker.SetTopicConfig(&cfg, k, v); err != nil {
			return err
		}
	}
	_, err = s.b.AlterTopicConfig(name, cfg)
	return err
}

func (s *filesStore) movement(ctx context.Context, name string, to int32) (string, error) {
	m, err := s.b.KeyMovement(ctx, name, to)
	if err != nil {
		return "", err
	}
	return m.String(), nil
}

func (s *filesStore) grow(_ context.Context, name string, to int32) error {
	_, err := s.b.AddPartitions(name, to)
	return err
}

func (s *filesStore) describe(_ context.Context, name string) (topicDescription, error) {
	ti, err := s.b.Topic(name)
	if err != nil {
		return topicDescription{}, err
	}
	d := topicDescription{Name: name, Configs: map[string]string{}}
	for _, f := range broker.TopicConfigNames {
		d.Configs[f.Name] = f.Get(ti.Config)
	}
	for _, p := range ti.Partitions {
		d.Partitions = append(d.Partitions, partitionJSON{Partition: p.Partition, StartOffset: p.LogStartOffset, EndOffset: p.LogEndOffset,
			Bytes: p.Bytes, Segments: p.Segments})
	}
	return d, nil
}

func (s *filesStore) remove(_ context.Context, name string) error { return s.b.DeleteTopic(name) }

// daemonStore acts through the running daemon's admin socket.
type daemonStore struct {
	cl   *kgo.Client
	adm  *kadm.Client
	sock string
}

func (s *daemonStore) where() string { return "through the running relay at " + s.sock }
func (s *daemonStore) close()        { s.cl.Close() }

func (s *daemonStore) create(ctx context.Context, name string, partitions int32, configs map[string]string) error {
	if partitions <= 0 {
		partitions = -1
	}
	cm := map[string]*string{}
	for k, v := range configs {
		cm[k] = &v
	}
	resp, err := s.adm.CreateTopic(ctx, partitions, -1, cm, name)
	if err == nil {
		err = kafkaErr(resp.Err, resp.ErrMessage)
	}
	return err
}

func (s *daemonStore) alter(ctx context.Context, name string, set map[string]string, del []string) error {
	var changes []kadm.AlterConfig
	for k, v := range set {
		changes = append(changes, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: &v})
	}
	for _, k := range del {
		changes = append(changes, kadm.AlterConfig{Op: kadm.DeleteConfig, Name: k})
	}
	resps, err := s.adm.AlterTopicConfigs(ctx, changes, name)
	if err != nil {
		return err
	}
	for _, r := range resps {
		if err := kafkaErr(r.Err, r.ErrMessage); err != nil {
			return err
		}
	}
	return nil
}

func (s *daemonStore) movement(ctx context.Context, name string, to int32) (string, error) {
	resps, err := s.adm.ValidateUpdatePartitions(ctx, int(to), name)
	if err != nil {
		return "", err
	}
	r := resps[name]
	return r.ErrMessage, kafkaErr(r.Err, r.ErrMessage)
}

func (s *daemonStore) grow(ctx context.Context, name string, to int32) error {
	resps, err := s.adm.UpdatePartitions(ctx, int(to), name)
	if err != nil {
		return err
	}
	r := resps[name]
	return kafkaErr(r.Err, r.ErrMessage)
}

func (s *daemonStore) describe(ctx context.Context, name string) (topicDescription, error) {
	d := topicDescription{Name: name, Configs: map[string]string{}}
	rcs, err := s.adm.DescribeTopicConfigs(ctx, name)
	if err != nil {
		return d, err
	}
	rc, err := rcs.On(name, nil)
	if err == nil {
		err = kafkaErr(rc.Err, rc.ErrMessage)
	}
	if err != nil {
		return d, err
	}
	for _, c := range rc.Configs {
		d.Configs[c.Key] = c.MaybeValue()
	}
	starts, err := s.adm.ListStartOffsets(ctx, name)
	if err != nil {
		return d, err
	}
	ends, err := s.adm.ListEndOffsets(ctx, name)
	if err != nil {
		return d, err
	}
	ends.Each(func(o kadm.ListedOffset) {
		start, _ := starts.Lookup(name, o.Partition)
		d.Partitions = append(d.Partitions, partitionJSON{Partition: o.Partition, StartOffset: start.Offset, EndOffset: o.Offset})
	})
	sort.Slice(d.Partitions, func(i, j int) bool { return d.Partitions[i].Partition < d.Partitions[j].Partition })
	return d, nil
}

func (s *daemonStore) remove(ctx context.Context, name string) error {
	resp, err := s.adm.DeleteTopic(ctx, name)
	if err == nil {
		err = kafkaErr(resp.Err, resp.ErrMessage)
	}
	return err
}

// kafkaErr is a Kafka error with the broker's message, which says more.
func kafkaErr(err error, msg string) error {
	if err == nil || msg == "" {
		return err
	}
	return fmt.Errorf("%w: %s", err, msg)
}
