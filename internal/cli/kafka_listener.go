package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
	"github.com/outboxrelay/relay/internal/relayconf"
)

// listenerFlags secure the embedded broker's Kafka listener.
type listenerFlags struct {
	tls        serverTLSFlags
	usersFile  string
	mechanisms string
	aclFile    string
	superUsers string
	aclDefault string
	writable   string
	limits     struct {
		inflight   int64
		conns      int
		perAddress int
		idle       time.Duration
	}
}

func (f *listenerFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.tls.certFile, "listener-tls-cert-file", "", "embedded broker: PEM certificate (chain) of the Kafka listener, which then accepts TLS only")
	fs.StringVar(&f.tls.keyFile, "listener-tls-key-file", "", "embedded broker: PEM private key of --listener-tls-cert-file")
	fs.StringVar(&f.tls.clientCAFile, "listener-tls-client-ca-file", "", "embedded broker: PEM CAs; Kafka clients must then present a certificate they signed (mutual TLS)")
	fs.StringVar(&f.usersFile, "listener-users-file", "", "embedded broker: require SASL on the Kafka listener, for the users in this file (see relay listener-users; re-read when it changes)")
	fs.StringVar(&f.aclFile, "listener-acl-file", "", "embedded broker: keep the Kafka listener's ACLs in this JSON file, changed by CreateAcls and DeleteAcls (kafka-acls.sh, kadm); without it there are none and they cannot be changed")
	fs.StringVar(&f.superUsers, "listener-super-users", "", "embedded broker: principals allowed everything on the Kafka listener, including managing ACLs, as User:name[,User:name]")
	fs.StringVar(&f.aclDefault, "listener-acl-default", "allow", "embedded broker: what the Kafka listener allows on a topic or group no ACL names: allow or deny (writing to the relay's topics and managing ACLs always need an ACL)")
	fs.StringVar(&f.writable, "listener-writable-topics", "", "embedded broker: topic prefixes Kafka clients may produce to without an ACL, as prefix[,prefix]; every other topic is the relay's and read-only for clients")
	fs.Int64Var(&f.limits.inflight, "listener-max-inflight-bytes", 64<<20, "embedded broker: server-wide budget of Kafka request and fetch response bytes in flight; clients over it wait (0: none). A request may be a quarter of it at most")
	fs.IntVar(&f.limits.conns, "listener-max-connections", protocol.DefaultMaxConnections, "embedded broker: most open Kafka client connections; more are closed at once, logged and counted (0: no limit)")
	fs.IntVar(&f.limits.perAddress, "listener-max-connections-per-address", 0, "embedded broker: most open Kafka client connections from one IP address, as Kafka's max.connections.per.ip; more are closed at once, logged and counted (0: no limit, Kafka's default)")
	fs.DurationVar(&f.limits.idle, "listener-idle-timeout", 10*time.Minute, "embedded broker: close a Kafka client connection that sent nothing for this long (0: never)")
	fs.StringVar(&f.mechanisms, "listener-sasl-mechanisms", "SCRAM-SHA-256,SCRAM-SHA-512", "embedded broker: SASL mechanisms offered with --listener-users-file: SCRAM-SHA-256, SCRAM-SHA-512, PLAIN (PLAIN needs TLS)")
}

// config is the part of the server's Config the flags set.
func (f *listenerFlags) config() (protocol.Config, error) {
	cfg := protocol.Config{MaxInFlightBytes: f.limits.inflight, MaxConnections: f.limits.conns,
		MaxConnectionsPerAddress: f.limits.perAddress, IdleTimeout: f.limits.idle}
	if f.limits.inflight < 0 || f.limits.conns < 0 || f.limits.perAddress < 0 || f.limits.idle < 0 {
		return cfg, usagef("--listener-max-* and --listener-idle-timeout must not be negative")
	}
	var err error
	if cfg.TLS, err = f.tls.config("listener"); err != nil {
		return cfg, err
	}
	if f.usersFile != "" {
		if cfg.Users, err = protocol.OpenUsersFile(f.usersFile); err != nil {
			return cfg, fmt.Errorf("--listener-users-file: %w", err)
		}
		for _, m := range strings.Split(f.mechanisms, ",") {
			m = strings.ToUpper(strings.TrimSpace(m))
			if m == "" {
				continue
			}
			if m != protocol.MechanismPlain && m != protocol.MechanismSCRAM256 && m != protocol.MechanismSCRAM512 {
				return cfg, usagef("--listener-sasl-mechanisms: %q is not PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", m)
			}
			if m == protocol.MechanismPlain && cfg.TLS == nil {
				return cfg, usagef("--listener-sasl-mechanisms: PLAIN sends the password itself; it needs TLS (--listener-tls-cert-file)")
			}
			cfg.SASLMechanisms = append(cfg.SASLMechanisms, m)
		}
		if len(cfg.SASLMechanisms) == 0 {
			return cfg, usagef("--listener-sasl-mechanisms: none given")
		}
	}
	if f.aclDefault != "allow" && f.aclDefault != "deny" {
		return cfg, usagef("--listener-acl-default %q: must be allow or deny", f.aclDefault)
	}
	ac := protocol.AuthorizerConfig{File: f.aclFile, DenyByDefault: f.aclDefault == "deny", SuperUsers: splitList(f.superUsers)}
	if prefixes := splitList(f.writable); len(prefixes) > 0 {
		ac.ReadOnlyTopics = func(topic string) bool {
			return !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(topic, p) })
		}
	}
	if cfg.Authorizer, err = protocol.NewAuthorizer(ac); err != nil {
		return cfg, fmt.Errorf("--listener-acl-file / --listener-super-users: %w", err)
	}
	return cfg, nil
}

func splitList(s string) []string {
	var out []string
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			out = append(out, v)
		}
	}
	return out
}

// kafkaListener serves the embedded broker over the Kafka protocol while
// this relay leads (the broker is open only then), and exports consumer
// group lag from whichever server is current.
type kafkaListener struct {
	addr       string
	advertised string
	// autoCreate lets a metadata request create a missing topic
	// (--create-topics).
	autoCreate bool
	// security is the listener's TLS, SASL, ACL and limit settings.
	security protocol.Config
	// allowRepartition says whether CreatePartitions may raise a count
	// (--allow-repartition, re-read from the config file on SIGHUP).
	allowRepartition func() bool
	// shareGroups are the config file's declared share groups as last
	// read (nil without --config).
	shareGroups func() []relayconf.ShareGroup
	log         *slog.Logger

	srv whileOpen[protocol.Server]
}

// attach is the embedded sink's OnOpen hook. A listener that cannot start
// (its address in use, say) fails the sink's start: the relay is then not
// ready, says why, and tries again with its restart backoff.
func (k *kafkaListener) attach(b *broker.Broker) (stop func(), err error) {
	cfg := k.security
	cfg.AdvertisedAddr, cfg.AutoCreateTopics, cfg.Logger, cfg.AllowRepartition = k.advertised, k.autoCreate, k.log, k.allowRepartition
	srv, err := protocol.NewServer(b, cfg)
	if err != nil {
		return nil, fmt.Errorf("starting the Kafka listener: %w", err)
	}
	if err := applyShareGroups(srv, k.shareGroups()); err != nil {
		_ = srv.Close()
		return nil, err
	}
	ln, err := net.Listen("tcp", k.addr)
	if err != nil {
		_ = srv.Close()
		return nil, fmt.Errorf("starting the Kafka listener on %s: %w", k.addr, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ctx, ln); err != nil {
			k.log.Error("Kafka listener stopped", "err", err)
		}
	}()
	release := k.srv.hold(srv)
	k.log.Info("serving the Kafka protocol", "addr", ln.Addr().String(), "advertised", k.advertised, "tls", cfg.TLS != nil, "sasl", strings.Join(cfg.SASLMechanisms, ","))
	return func() {
		release()
		cancel()
		<-done
	}, nil
}

// applyShareGroups sets the declared share groups' configs on srv, as
// IncrementalAlterConfigs SET would: the declared values win over any
// earlier alteration, the configs not declared keep theirs. A group
// refused (its id held by a classic or consumer group) does not keep the
// others from being set; the refusals are returned together.
func applyShareGroups(srv *protocol.Server, groups []relayconf.ShareGroup) error {
	var errs []error
	for _, g := range groups {
		if err := srv.ApplyShareGroupConfigs(g.Name, g.Configs); err != nil {
			errs = append(errs, fmt.Errorf("declared share groups (line %d): %w", g.Line, err))
		}
	}
	return errors.Join(errs...)
}

// reloadShareGroups applies the share groups of a re-read config file
// to the running listener, if one runs.
func (k *kafkaListener) reloadShareGroups(groups []relayconf.ShareGroup) error {
	srv := k.srv.get()
	if srv == nil {
		return nil
	}
	return applyShareGroups(srv, groups)
}

func (k *kafkaListener) Describe(ch chan<- *prometheus.Desc) {}

func (k *kafkaListener) Collect(ch chan<- prometheus.Metric) {
	if srv := k.srv.get(); srv != nil {
		srv.Collector().Collect(ch)
	}
}

func validateListenAddr(flag, addr string) error {
	if addr == "" {
		return nil
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return usagef("%s %q: %v", flag, addr, err)
	}
	return nil
}

// brokerStorage exports the embedded broker's storage health and lost data
// when no Kafka listener (which exports them with its own) runs.
type brokerStorage struct {
	b     whileOpen[broker.Broker]
	parts protocol.PartitionSeries
}

// attach is the embedded sink's OnOpen hook.
func (s *brokerStorage) attach(b *broker.Broker) (stop func(), err error) {
	return s.b.hold(b), nil
}

func (s *brokerStorage) Describe(chan<- *prometheus.Desc) {}

func (s *brokerStorage) Collect(ch chan<- prometheus.Metric) {
	if b := s.b.get(); b != nil {
		protocol.StorageCollector(b, s.parts).Collect(ch)
	}
}
