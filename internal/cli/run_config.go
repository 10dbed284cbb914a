package cli

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"sync"
	"syscall"

	"github.com/outboxrelay/relay/internal/broker"
	"github.com/outboxrelay/relay/internal/broker/protocol"
	"github.com/outboxrelay/relay/internal/relayconf"
)

// readConfig reads --config: each of its settings sets the flag of that
// name unless the command line or RELAY_* already did. fs holds the
// flags parsed so far.
func (f *runFlags) readConfig(fs *flag.FlagSet) error {
	f.fs = fs
	if f.config == "" {
		return nil
	}
	file, err := relayconf.Read(f.config)
	if err != nil {
		return usagef("--config: %v", err)
	}
	given := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { given[fl.Name] = true })
	for _, s := range file.Flags {
		at := &relayconf.Error{Path: file.Path, Line: s.Line}
		switch {
		case s.Name == "config":
			at.Msg = "config names the file itself; it cannot be set in it"
		case fs.Lookup(s.Name) == nil:
			at.Msg = fmt.Sprintf("unknown setting %q: not a flag of relay run, nor topics, topic-defaults or share-groups", s.Name)
		case given[s.Name]:
			continue
		default:
			if err := fs.Set(s.Name, s.Value); err != nil {
				at.Msg = fmt.Sprintf("%s: %v", s.Name, err)
			} else {
				continue
			}
		}
		return usagef("--config: %v", at)
	}
	f.file = file
	return nil
}

// adminSocket is the Unix socket in the data directory through which
// `relay topics` reaches the running daemon.
const adminSocket = "admin.sock"

// topicAdmin owns the running daemon's topic administration: it applies
// the config file's declared topics whenever the broker opens and on
// SIGHUP, and serves the admin socket of `relay topics` while the broker
// is open.
type topicAdmin struct {
	log     *slog.Logger
	dataDir string

	applyMu sync.Mutex // one Apply at a time
	mu      sync.Mutex
	f       *runFlags // the settings in force
	b       whileOpen[broker.Broker]
	// reloadShares applies a re-read file's share groups to the Kafka
	// listener (nil without one).
	reloadShares func([]relayconf.ShareGroup) error
}

func (f *runFlags) topicAdmin(log *slog.Logger) *topicAdmin {
	return &topicAdmin{log: log, f: f, dataDir: f.dataDir}
}

func (a *topicAdmin) current() (*runFlags, *broker.Broker) {
	a.mu.Lock()
	f := a.f
	a.mu.Unlock()
	return f, a.b.get()
}

// allowRepartition is --allow-repartition as last read.
func (a *topicAdmin) allowRepartition() bool {
	f, _ := a.current()
	return f.allowRepartition
}

// shareGroups are the declared share groups as last read.
func (a *topicAdmin) shareGroups() []relayconf.ShareGroup {
	f, _ := a.current()
	if f.file == nil {
		return nil
	}
	return f.file.ShareGroups
}

// wrap is the embedded sink's OnOpen hook: the declared topics are
// applied (a refusal fails the sink's start, which says why and is tried
// again), the admin socket opened, then next runs.
func (a *topicAdmin) wrap(next func(*broker.Broker) (func(), error)) func(*broker.Broker) (func(), error) {
	return func(b *broker.Broker) (func(), error) {
		f, _ := a.current()
		if f.file != nil {
			a.applyMu.Lock()
			err := f.file.Apply(context.Background(), b, f.allowRepartition, a.log)
			a.applyMu.Unlock()
			if err != nil {
				return nil, fmt.Errorf("declared topics: %w", err)
			}
		}
		stopAdmin := a.serveAdmin(b)
		var stopNext func()
		if next != nil {
			var err error
			if stopNext, err = next(b); err != nil {
				stopAdmin()
				return nil, err
			}
		}
		release := a.b.hold(b)
		return func() {
			release()
			if stopNext != nil {
				stopNext()
			}
			stopAdmin()
		}, nil
	}
}

// serveAdmin serves the Kafka protocol, without authentication, on the
// admin socket (mode 0600): whoever may open it may change the data
// directory's files anyway. `relay topics` confirms partition increases
// itself (--allow-repartition), so the socket allows them. The Kafka
// listener coordinates the broker's consumer groups: this server keeps
// its own groups in memory only, so it never overwrites their saved
// membership (protocol.Config.EphemeralGroups).
func (a *topicAdmin) serveAdmin(b *broker.Broker) (stop func()) {
	path := filepath.Join(a.dataDir, adminSocket)
	_ = os.Remove(path)
	srv, err := protocol.NewServer(b, protocol.Config{AdvertisedAddr: "relay-admin:9", Logger: a.log,
		AllowRepartition: func() bool { return true }, InitialRebalanceDelay: -1, EphemeralGroups: true})
	if err != nil {
		a.log.Error("admin socket not served", "err", err)
		return func() {}
	}
	ln, err := net.Listen("unix", path)
	if err == nil {
		err = os.Chmod(path, 0o600)
	}
	if err != nil {
		a.log.Error("admin socket not served; relay topics works only while the relay is stopped", "path", path, "err", err)
		if ln != nil {
			_ = ln.Close()
		}
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ctx, ln)
	}()
	return func() {
		cancel()
		<-done
		_ = srv.Close()
		_ = os.Remove(path)
	}
}

// watchSIGHUP re-reads --config on each SIGHUP until ctx ends or the
// returned stop is called; without --config SIGHUP keeps its default.
func (a *topicAdmin) watchSIGHUP(ctx context.Context) (stop func()) {
	f, _ := a.current()
	if f.config == "" {
		return func() {}
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGHUP)
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-sigs:
				a.reload()
			}
		}
	}()
	return func() {
		signal.Stop(sigs)
		cancel()
		<-done
	}
}

// reload re-reads the file with the same command line and environment.
// A file refused, or declared topics refused, leave everything as it
// was. The declared share groups' configs are then set on the Kafka
// listener (a group id a classic or consumer group holds is refused and
// logged; the other groups' configs are set). Settings other than the declared topics and allow-repartition
// take effect at the next start; they are named in a warning.
func (a *topicAdmin) reload() {
	old, b := a.current()
	nf, err := parseRun(old.stdio, old.args)
	if err != nil {
		a.log.Error("SIGHUP: config file refused; the running configuration stays", "err", err)
		return
	}
	var later []string
	nf.fs.VisitAll(func(fl *flag.Flag) {
		if fl.Name == "allow-repartition" {
			return
		}
		if o := old.fs.Lookup(fl.Name); o != nil && o.Value.String() != fl.Value.String() {
			later = append(later, fl.Name)
		}
	})
	sort.Strings(later)
	if len(later) > 0 {
		a.log.Warn("SIGHUP: these settings changed and take effect at the next start", "settings", later)
	}
	if b != nil && nf.file != nil {
		a.applyMu.Lock()
		err := nf.file.Apply(context.Background(), b, nf.allowRepartition, a.log)
		a.applyMu.Unlock()
		if err != nil {
			a.log.Error("SIGHUP: declared topics refused; nothing changed", "err", err)
			return
		}
	}
	a.mu.Lock()
	a.f = nf
	a.mu.Unlock()
	if a.reloadShares != nil && nf.file != nil {
		if err := a.reloadShares(nf.file.ShareGroups); err != nil {
			a.log.Error("SIGHUP: declared share groups refused", "err", err)
			return
		}
	}
	a.log.Info("SIGHUP: config file applied", "file", nf.config)
}
