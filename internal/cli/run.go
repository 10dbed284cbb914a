package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/cdc"
	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
	"github.com/outboxrelay/relay/internal/idlemem"
	"github.com/outboxrelay/relay/internal/pgconfig"
	"github.com/outboxrelay/relay/internal/relayconf"
	"github.com/outboxrelay/relay/internal/sink/embedded"
	"github.com/outboxrelay/relay/internal/sink/kafka"
	"github.com/outboxrelay/relay/poller"
	"github.com/outboxrelay/relay/relay"
)

func runCommand() *command {
	return &command{name: "run", summary: "run the relay daemon: drain the outbox into the log", run: runRelay}
}

type runFlags struct {
	db              dbFlags
	source          string
	sink            string
	kafka           kafkaSinkFlags
	dataDir         string
	httpAddr        string
	httpPprof       bool
	httpTLS         serverTLSFlags
	listener        listenerFlags
	batchSize       int
	batchBytes      int
	pollInterval    time.Duration
	partitions      int
	maxMessageBytes int
	fsync           string
	shutdownTimeout time.Duration
	kafkaAddr       string
	kafkaAdvertised string
	slot            string
	publication     string
	heartbeat       time.Duration
	cdcStreaming    bool
	cdcFailoverSlot bool
	logFormat       string
	logLevel        string
	retain          time.Duration
	pruneInterval   time.Duration
	cpuProfile      string
	ackInterval     time.Duration
	leaderLease     time.Duration
	allowLost       bool
	maxOpenFiles    int
	deadPolicy      string
	topicPolicies   string
	readyTimeout    time.Duration
	createTopics    bool
	schemaRun       schemaRunFlags
	cloudEvents     cloudEventsFlags
	partSeries      protocol.PartitionSeries
	// config is --config; file is what it held when parsed (run_config.go).
	config           string
	allowRepartition bool
	file             *relayconf.File
	args             []string
	stdio            IO
	fs               *flag.FlagSet
}

func (f *runFlags) register(fs *flag.FlagSet) {
	f.db.register(fs)
	fs.StringVar(&f.source, "source", "poll", "outbox reader: poll (SQL) or cdc (logical replication)")
	fs.StringVar(&f.sink, "sink", "embedded", "destination: embedded (the built-in broker) or kafka (Apache Kafka, see --kafka-brokers)")
	f.kafka.register(fs)
	fs.StringVar(&f.dataDir, "data-dir", "relay-data", "embedded broker data directory")
	fs.StringVar(&f.httpAddr, "http-addr", "127.0.0.1:9464", "address for /metrics, /healthz and /readyz (empty disables)")
	f.httpTLS.registerHTTP(fs)
	f.listener.register(fs)
	fs.BoolVar(&f.httpPprof, "http-pprof", false, "also serve Go's profiles on /debug/pprof/ on --http-addr (they reveal memory contents: keep off on a reachable address)")
	fs.IntVar(&f.batchSize, "batch-size", relay.DefaultBatchSize, "events read and published at once; up to 8x as many while a backlog is spread thin over many topics")
	fs.IntVar(&f.batchBytes, "batch-bytes", relay.DefaultBatchBytes, "most bytes of events (key + payload + headers) read and published at once (an event larger than this goes alone); the relay holds about 6 batches between reading and durability")
	fs.DurationVar(&f.pollInterval, "poll-interval", poller.DefaultPollInterval, "poll reader: query interval when no notification arrives")
	fs.IntVar(&f.partitions, "partitions", 8, "partition count of topics created on first use")
	fs.BoolVar(&f.createTopics, "create-topics", true, "embedded broker: create a topic on first use, by the relay or a Kafka client's metadata request (false: events for a missing topic wait in the outbox until it is created through the Kafka listener)")
	fs.IntVar(&f.maxMessageBytes, "max-message-bytes", relay.DefaultMaxMessageBytes, "largest event (key + payload + headers, the relay's own included); larger ones go to the dead letters. The default leaves room for the record's framing within the default max.message.bytes (1048588) of Kafka and the embedded broker")
	fs.IntVar(&f.maxOpenFiles, "max-open-files", 0, "embedded broker: at most this many segment files held open for appending across all partitions; past it the least recently used idle one is fsynced and closed until next used (0: one per partition)")
	fs.BoolVar(&f.allowLost, "allow-lost-partitions", false, "embedded broker: open even when a known partition's directory is missing, recreating it empty with the loss on record (without it the relay refuses to start and names the partition)")
	fs.StringVar(&f.fsync, "fsync", "always", "embedded broker durability: always (fsync before acknowledging) or interval (unsafe: a machine crash can lose acknowledged events)")
	fs.DurationVar(&f.ackInterval, "ack-interval", relay.DefaultAckInterval, "shortest time between two acknowledgement transactions (deleting published rows, saving the position), 10 times that while a backlog is read; 0 commits each batch's at once")
	fs.DurationVar(&f.leaderLease, "leader-lease", relay.DefaultLease, "how long a leader's renewal of its leadership counts: a standby takes over after a lease without renewal, and the leader stops appending and acknowledging a fifth of a lease before that")
	fs.DurationVar(&f.shutdownTimeout, "shutdown-timeout", relay.DefaultShutdownTimeout, "on SIGTERM, how long the in-flight batch may take to finish")
	fs.StringVar(&f.kafkaAddr, "kafka-addr", "127.0.0.1:9092", "embedded broker: Kafka protocol listener address (empty disables)")
	fs.StringVar(&f.kafkaAdvertised, "kafka-advertised-addr", "", "embedded broker: host:port Kafka clients are told to connect to (default: the address they reached)")
	fs.StringVar(&f.slot, "slot", "", "cdc reader: replication slot name (default relay_<schema>_<database oid>, unique in the cluster; relay_<schema> when a slot of that name, the earlier default, exists in the database)")
	fs.StringVar(&f.publication, "publication", "", "cdc reader: publication name (default relay_<schema>)")
	fs.DurationVar(&f.heartbeat, "heartbeat-interval", cdc.DefaultHeartbeatInterval, "cdc reader: how often a WAL message lets the slot advance while the outbox is idle")
	fs.BoolVar(&f.cdcFailoverSlot, "cdc-failover-slot", true, "cdc reader: on PostgreSQL 17 and later, create the slot with failover, so that standbys with sync_replication_slots = on keep a copy a promotion can continue from; /readyz warns when the slot would not survive a promotion; false: a slot only on the primary, no warnings")
	fs.BoolVar(&f.cdcStreaming, "cdc-streaming", true, "cdc reader: on PostgreSQL 14 and later, have the server stream large transactions while they run (pgoutput protocol 2), held by the relay until commit and spilled to a temporary directory beyond 16 MiB; false: protocol 1, the server holds each transaction until it commits")
	fs.DurationVar(&f.retain, "retain", 0, "keep published events this long in <schema>.events_archive for relay replay (0 deletes them once published)")
	fs.DurationVar(&f.pruneInterval, "prune-interval", relay.DefaultPruneInterval, "with --retain: how often archived events older than the retention are deleted")
	fs.StringVar(&f.logFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&f.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&f.deadPolicy, "dead-letter-policy", relay.PolicySkip, "what a dead letter does to its key's later events: skip (they are published) or hold-key (they wait, in order, until it is retried or discarded)")
	fs.StringVar(&f.topicPolicies, "dead-letter-policy-topics", "", "per-topic dead-letter policies overriding --dead-letter-policy, as topic=policy[,topic=policy]")
	fs.DurationVar(&f.readyTimeout, "ready-timeout", relay.DefaultReadyTimeout, "/readyz fails when no heartbeat went through the whole path (read, published, acknowledged) for this long; the leader sends one every sixth of it")
	f.schemaRun.register(fs)
	f.cloudEvents.register(fs)
	fs.IntVar(&f.partSeries.Max, "metrics-partition-series-max", protocol.DefaultPartitionSeriesMax, "embedded broker: above this many partitions (all topics) the per-partition series relay_broker_partition_* are not exported, only the per-topic sums relay_broker_topic_*")
	fs.BoolVar(&f.partSeries.Always, "metrics-per-partition", false, "embedded broker: export the per-partition series at any partition count (each partition costs 3 series)")
	fs.StringVar(&f.cpuProfile, "cpu-profile", "", "write a CPU profile of the whole run to this file (for go tool pprof)")
	fs.StringVar(&f.config, "config", "", "YAML file of settings (any flag of relay run, by name), declared topics (topics, topic-defaults) and share groups (share-groups); re-read on SIGHUP; flags and RELAY_* win")
	fs.BoolVar(&f.allowRepartition, "allow-repartition", false, "embedded broker: confirm partition increases, from the config file's topics and from Kafka clients' CreatePartitions (keys move: see docs/topics.md)")
}

func (f *runFlags) validate() error {
	switch {
	case f.source != "poll" && f.source != "cdc":
		return usagef("--source %q: must be poll or cdc", f.source)
	case f.sink != "embedded" && f.sink != "kafka":
		return usagef("--sink %q: must be embedded or kafka", f.sink)
	case f.dataDir == "" && f.sink == "embedded":
		return usagef("--data-dir is required with --sink embedded")
	case !f.createTopics && f.kafkaAddr == "" && f.sink == "embedded":
		return usagef("--create-topics=false needs the Kafka listener (--kafka-addr): topics are then created through it, and nothing else could create them")
	case f.batchSize < 1 || f.batchSize > 100_000:
		return usagef("--batch-size %d: must be 1..100000", f.batchSize)
	case f.batchBytes < 1:
		return usagef("--batch-bytes %d: must be positive", f.batchBytes)
	case f.partitions < 1 || f.partitions > 10_000:
		return usagef("--partitions %d: must be 1..10000", f.partitions)
	case f.partSeries.Max < 1:
		return usagef("--metrics-partition-series-max must be positive")
	case f.maxOpenFiles < 0:
		return usagef("--max-open-files must not be negative")
	case f.retain < 0:
		return usagef("--retain must not be negative")
	case f.pruneInterval <= 0:
		return usagef("--prune-interval must be positive")
	case f.readyTimeout < 300*time.Millisecond:
		return usagef("--ready-timeout %v: must be at least 300ms", f.readyTimeout)
	case f.pollInterval <= 0:
		return usagef("--poll-interval must be positive")
	case f.ackInterval < 0 || f.ackInterval > time.Minute:
		return usagef("--ack-interval %v: must be 0..1m", f.ackInterval)
	case f.leaderLease < 100*time.Millisecond || f.leaderLease > 10*time.Minute:
		return usagef("--leader-lease %v: must be 100ms..10m", f.leaderLease)
	case f.maxMessageBytes < 1:
		return usagef("--max-message-bytes must be positive")
	case f.fsync != "always" && f.fsync != "interval":
		return usagef("--fsync %q: must be always or interval", f.fsync)
	case f.logFormat != "text" && f.logFormat != "json":
		return usagef("--log-format %q: must be text or json", f.logFormat)
	case f.httpAddr == "" && f.httpTLS != (serverTLSFlags{}):
		return usagef("--http-tls-* need --http-addr")
	}
	if err := f.schemaRun.validate(f.httpAddr); err != nil {
		return err
	}
	if err := f.cloudEvents.validate(); err != nil {
		return err
	}
	if err := relay.ValidPolicy(f.deadPolicy); err != nil {
		return usagef("--dead-letter-policy: %v", err)
	}
	if _, err := f.topicPolicyMap(); err != nil {
		return usagef("--dead-letter-policy-topics: %v", err)
	}
	for flag, addr := range map[string]string{"--kafka-addr": f.kafkaAddr, "--kafka-advertised-addr": f.kafkaAdvertised, "--http-addr": f.httpAddr} {
		if err := validateListenAddr(flag, addr); err != nil {
			return err
		}
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(f.logLevel)); err != nil {
		return usagef("--log-level %q: must be debug, info, warn or error", f.logLevel)
	}
	return nil
}

func (f *runFlags) topicPolicyMap() (map[string]string, error) {
	if f.topicPolicies == "" {
		return nil, nil
	}
	return relay.ParseTopicPolicies(strings.Split(f.topicPolicies, ","))
}

func (f *runFlags) logger(stdio IO) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(f.logLevel))
	opts := &slog.HandlerOptions{Level: level}
	if f.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(stdio.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(stdio.Stderr, opts))
}

func parseRun(stdio IO, args []string) (*runFlags, error) {
	return parseRunAs("relay run", stdio, args, nil)
}

// parseRunAs parses run's flags, and those extra adds, for the command
// called name (relay doctor takes run's flags and config).
func parseRunAs(name string, stdio IO, args []string, extra func(*flag.FlagSet)) (*runFlags, error) {
	var f runFlags
	fs := flagSet(name, stdio)
	f.register(fs)
	if extra != nil {
		extra(fs)
	}
	if err := parse(fs, args, stdio, false); err != nil {
		return nil, err
	}
	f.args, f.stdio = args, stdio
	if err := f.readConfig(fs); err != nil {
		return nil, err
	}
	return &f, f.validate()
}

// Serve runs `relay run` with args in this process until ctx ends, for a
// program that runs the relay beside other work (relay-dev demo): without
// the relay binary's own signal handling, GC tuning and CPU profile, which
// belong to the process.
func Serve(ctx context.Context, stdio IO, args []string) error {
	f, err := parseRun(stdio, args)
	if err != nil {
		return err
	}
	return f.serve(ctx, f.logger(stdio))
}

func runRelay(ctx context.Context, stdio IO, args []string) error {
	f, err := parseRun(stdio, args)
	if err != nil {
		return err
	}
	log := f.logger(stdio)
	forceOnSecondSignal(ctx, log)
	tuneGC(stdio)
	watchCtx, stopWatch := context.WithCancel(ctx)
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		idlemem.Watch(watchCtx, idlemem.Config{BusyPercent: busyGCPercent, KeepPercent: stdio.Getenv("GOGC") != ""})
	}()
	defer func() { stopWatch(); <-watched }()
	if f.cpuProfile != "" {
		stop, err := startCPUProfile(f.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	return f.serve(ctx, log)
}

// ackInterval maps the flag's 0 (no wait) to the Config's negative: a zero
// Config field means the default.
func ackInterval(d time.Duration) time.Duration {
	if d == 0 {
		return -1
	}
	return d
}

// startCPUProfile profiles the process until the returned stop is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// serve builds the daemon from validated flags and runs it until ctx ends.
func (f *runFlags) serve(ctx context.Context, log *slog.Logger) error {
	connCfg, err := pgconfig.ParseConfig(f.db.url)
	if err != nil {
		return err
	}
	tracer, err := startTracing(log)
	if err != nil {
		return err
	}
	defer tracer.stop(log)
	f.preflight(ctx, log)
	if ctx.Err() != nil {
		return nil // stopped during the checks, before anything started
	}
	metrics := relay.NewMetrics()
	metrics.Registry.MustRegister(buildInfoGauge())
	source, err := f.newSource(log, metrics)
	if err != nil {
		return err
	}
	sync := broker.SyncBeforeAck
	if f.fsync == "interval" {
		sync = broker.SyncIntervalUnsafe
	}
	admin := f.topicAdmin(log)
	var onOpen func(*broker.Broker) (func(), error)
	switch {
	case f.sink != "embedded":
	case f.kafkaAddr != "":
		// The listener exports the broker's storage metrics with its own.
		security, err := f.listener.config()
		if err != nil {
			return err
		}
		security.PartitionSeries = f.partSeries
		kl := &kafkaListener{addr: f.kafkaAddr, advertised: f.kafkaAdvertised, autoCreate: f.createTopics, security: security, log: log,
			allowRepartition: admin.allowRepartition, shareGroups: admin.shareGroups}
		admin.reloadShares = kl.reloadShareGroups
		metrics.Registry.MustRegister(kl)
		onOpen = kl.attach
	default:
		bs := &brokerStorage{parts: f.partSeries}
		metrics.Registry.MustRegister(bs)
		onOpen = bs.attach
	}
	if admin.reloadShares == nil && len(admin.shareGroups()) > 0 {
		log.Warn("the config file declares share groups; only the embedded broker's Kafka listener (--kafka-addr) serves them, so they are not set")
	}
	if f.sink == "embedded" {
		// A data directory a newer relay wrote is refused before this
		// relay stands by or leads: see broker.FormatVersion.
		if err := broker.CheckFormat(f.dataDir); err != nil {
			return err
		}
	}
	var sink relay.Sink
	if f.sink == "kafka" {
		cfg, err := f.kafka.config(log)
		if err != nil {
			return err
		}
		if sink, err = kafka.New(cfg); err != nil {
			return err
		}
	} else if sink, err = embedded.New(embedded.Config{
		Broker:        broker.Options{Dir: f.dataDir, Sync: sync, DefaultPartitions: int32(f.partitions), Logger: log, AllowLostPartitions: f.allowLost, MaxOpenFiles: f.maxOpenFiles},
		OnOpen:        admin.wrap(onOpen),
		WaitForTopics: !f.createTopics,
		Logger:        log,
	}); err != nil {
		return err
	}
	topicPolicies, err := f.topicPolicyMap()
	if err != nil {
		return err
	}
	cloudEvents, err := f.cloudEventsConfig()
	if err != nil {
		return err
	}
	contracts, err := f.schemaRun.open(ctx, f.db)
	if err != nil {
		return err
	}
	defer contracts.close()
	r, err := relay.New(relay.Config{
		DatabaseURL:      f.db.url,
		Schema:           f.db.schema,
		SourceKind:       f.source,
		BatchSize:        f.batchSize,
		BatchBytes:       f.batchBytes,
		MaxMessageBytes:  f.maxMessageBytes,
		ShutdownTimeout:  f.shutdownTimeout,
		Lease:            f.leaderLease,
		AckInterval:      ackInterval(f.ackInterval),
		Retain:           f.retain,
		PruneInterval:    f.pruneInterval,
		DeadLetterPolicy: f.deadPolicy,
		TopicPolicies:    topicPolicies,
		ReadyTimeout:     f.readyTimeout,
		Validator:        contracts.relayValidator(),
		Tracer:           tracer.Tracer(tracerName),
		CloudEvents:      cloudEvents,
		Logger:           log,
		Metrics:          metrics,
	}, source, sink)
	if err != nil {
		return err
	}
	if f.httpAddr != "" {
		httpTLS, err := f.httpTLS.config("http")
		if err != nil {
			return err
		}
		stop, _, err := serveHTTP(f.httpAddr, httpHandler(contracts.handler(&f.schemaRun, r.Handler(), log), f.httpPprof), httpTLS, log)
		if err != nil {
			return err
		}
		defer stop()
	}
	defer admin.watchSIGHUP(ctx)()
	log.Info("relay starting", "database", pgconfig.Describe(&connCfg.Config), "schema", f.db.schema,
		"source", f.source, "sink", f.sink, "data_dir", f.dataDir, "http_addr", f.httpAddr)
	if err := r.Run(ctx); err != nil {
		return err
	}
	log.Info("relay stopped")
	return nil
}

func (f *runFlags) newSource(log *slog.Logger, metrics *relay.Metrics) (relay.Source, error) {
	if f.source == "poll" {
		return poller.New(poller.Config{DatabaseURL: f.db.url, Schema: f.db.schema, PollInterval: f.pollInterval, Logger: log,
			MaxMessageBytes: f.maxMessageBytes, PageBytes: f.batchBytes})
	}
	src, err := cdc.New(cdc.Config{DatabaseURL: f.db.url, Schema: f.db.schema, SlotName: f.slot,
		PublicationName: f.publication, HeartbeatInterval: f.heartbeat, Logger: log, QueueBytes: 2 * f.batchBytes,
		NoStreaming: !f.cdcStreaming, NoFailoverSlot: !f.cdcFailoverSlot})
	if err != nil {
		return nil, err
	}
	slotLag := func(pick func(lag, retained int64) int64) func() float64 {
		return func() float64 {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			lag, retained, err := src.SlotLag(ctx)
			if err != nil {
				return -1
			}
			return float64(pick(lag, retained))
		}
	}
	metrics.Registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_cdc_slot_lag_bytes",
			Help: "WAL bytes between the server's current position and the slot's confirmed flush position (-1 when unknown).",
		}, slotLag(func(lag, _ int64) int64 { return lag })),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "relay_cdc_slot_retained_wal_bytes",
			Help: "WAL bytes the slot keeps on the server (from its restart position; -1 when unknown).",
		}, slotLag(func(_, retained int64) int64 { return retained })),
	)
	return src, nil
}

// busyGCPercent is the collector's growth while the relay works.
const busyGCPercent = 400

// tuneGC trades memory the relay barely uses for CPU it needs: profiles
// of a backlog drain spent about a third of the relay's CPU allocating and
// collecting. The collector runs at 400% heap growth instead of 100%,
// under a soft 192 MiB limit that keeps the heap bounded. GOGC and
// GOMEMLIMIT, when set, win. While the relay idles, idlemem.Watch
// collects at 100% and returns the free memory to the system.
func tuneGC(stdio IO) {
	if stdio.Getenv("GOGC") == "" {
		debug.SetGCPercent(busyGCPercent)
	}
	if stdio.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(192 << 20)
	}
}

// forceOnSecondSignal exits at once on the second SIGINT or SIGTERM; the
// first one cancels ctx, which stops the relay gracefully.
func forceOnSecondSignal(ctx context.Context, log *slog.Logger) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		<-sigs // the signal that cancelled ctx
		<-sigs
		log.Error("second signal: exiting without finishing the in-flight batch")
		os.Exit(1)
	}()
}
