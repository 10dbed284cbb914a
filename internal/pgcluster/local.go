package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// dirPrefix names the temporary directories of local clusters, so that a
// later Start can find and remove those whose owner died without cleaning up.
const dirPrefix = "relay-pg-"

type binaries struct {
	initdb   string
	postgres string
}

// findBinaries looks for initdb and postgres on PATH, then in the newest
// /usr/lib/postgresql/*/bin.
func findBinaries() (binaries, error) {
	initdb, err1 := exec.LookPath("initdb")
	postgres, err2 := exec.LookPath("postgres")
	if err1 == nil && err2 == nil {
		return binaries{initdb: initdb, postgres: postgres}, nil
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, dir := range dirs {
		b := binaries{initdb: filepath.Join(dir, "initdb"), postgres: filepath.Join(dir, "postgres")}
		if isExecutable(b.initdb) && isExecutable(b.postgres) {
			return b, nil
		}
	}
	return binaries{}, errors.New("initdb and postgres are neither on PATH nor under /usr/lib/postgresql/*/bin")
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func isExecutable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && !st.IsDir() && st.Mode()&0o111 != 0
}

// runAs is the OS user a local server runs as: nil for the current user, or
// the postgres user when the current user is root.
func runAs() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, PostgreSQL needs the \"postgres\" OS user: %w", err)
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

type localServer struct {
	bin     binaries
	cred    *syscall.Credential
	root    string
	dataDir string
	port    int
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	logPath string
	// settings are the postgresql.conf settings the server runs with.
	settings map[string]string
}

func startLocal(ctx context.Context, bin binaries, opts Options) (*Cluster, error) {
	s, err := newLocalServer(bin)
	if err != nil {
		return nil, err
	}
	initdb := exec.CommandContext(ctx, bin.initdb, "-D", s.dataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
	initdb.Dir = s.root
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred}
	if out, err := initdb.CombinedOutput(); err != nil {
		os.RemoveAll(s.root)
		return nil, fmt.Errorf("pgcluster: initdb: %w: %s", err, bytes.TrimSpace(out))
	}
	return s.launch(ctx, settings(opts))
}

// newLocalServer makes the temporary directory of a local server, owned by
// the OS user the server runs as; its data directory is yet to be made.
func newLocalServer(bin binaries) (*localServer, error) {
	removeStaleDirs()
	cred, err := runAs()
	if err != nil {
		return nil, err
	}
	root, err := os.MkdirTemp("", dirPrefix+"*")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	s := &localServer{bin: bin, cred: cred, root: root, dataDir: filepath.Join(root, "data"), logPath: filepath.Join(root, "postgres.log")}
	if err := os.WriteFile(filepath.Join(root, "owner.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(root)
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	if cred != nil {
		if err := os.Chown(root, int(cred.Uid), int(cred.Gid)); err != nil {
			os.RemoveAll(root)
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
	}
	return s, nil
}

// launch starts the server on a free port with the settings and returns
// its Cluster; on failure it removes the server's directory.
func (s *localServer) launch(ctx context.Context, conf map[string]string) (*Cluster, error) {
	s.settings = conf
	var err, lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		if s.port, err = freePort(); err != nil {
			os.RemoveAll(s.root)
			return nil, err
		}
		s.args = []string{"-D", s.dataDir, "-p", strconv.Itoa(s.port), "-c", "listen_addresses=127.0.0.1",
			"-c", "unix_socket_directories=" + s.root}
		for name, value := range conf {
			s.args = append(s.args, "-c", name+"="+value)
		}
		if lastErr = s.start(ctx); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		s.kill()
		os.RemoveAll(s.root)
		return nil, lastErr
	}
	return &Cluster{
		kind:    KindLocal,
		url:     s.url(),
		dataDir: s.dataDir,
		local:   s,
		stop: func(ctx context.Context) error {
			err := s.shutdown(ctx, syscall.SIGINT)
			if rmErr := os.RemoveAll(s.root); rmErr != nil {
				err = errors.Join(err, rmErr)
			}
			return err
		},
		restart: func(ctx context.Context, immediate bool) error {
			sig := syscall.SIGINT
			if immediate {
				sig = syscall.SIGQUIT
			}
			if err := s.shutdown(ctx, sig); err != nil {
				return err
			}
			return s.start(ctx)
		},
	}, nil
}

func (s *localServer) url() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", s.port)
}

// start runs postgres in the foreground as a child process. Pdeathsig makes
// the server shut down at once if this process dies without stopping it.
func (s *localServer) start(ctx context.Context) error {
	logFile, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	defer logFile.Close()
	cmd := exec.Command(s.bin.postgres, s.args...)
	cmd.Dir = s.root
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: s.cred, Pdeathsig: syscall.SIGQUIT, Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: starting postgres: %w", err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func(exited chan struct{}) {
		cmd.Wait()
		close(exited)
	}(s.exited)

	readyCtx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	err = waitReady(readyCtx, func(ctx context.Context) error {
		select {
		case <-s.exited:
			return errExited
		default:
		}
		conn, err := pgx.Connect(ctx, s.url())
		if err != nil {
			return err
		}
		return conn.Close(ctx)
	})
	if err != nil {
		s.kill()
		return fmt.Errorf("%w; server log:\n%s", err, tail(s.logPath, 20))
	}
	return nil
}

var errExited = errors.New("postgres exited")

// shutdown sends sig to the postmaster and waits for it to exit, escalating
// to an immediate shutdown and then SIGKILL when ctx ends first.
func (s *localServer) shutdown(ctx context.Context, sig syscall.Signal) error {
	if s.cmd == nil {
		return nil
	}
	s.cmd.Process.Signal(sig)
	select {
	case <-s.exited:
		s.cmd = nil
		return nil
	case <-ctx.Done():
	case <-time.After(30 * time.Second):
	}
	s.kill()
	return fmt.Errorf("pgcluster: postgres did not stop after %v; killed it", sig)
}

func (s *localServer) kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(syscall.SIGQUIT)
	select {
	case <-s.exited:
	case <-time.After(5 * time.Second):
		syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.exited
	}
	s.cmd = nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// removeStaleDirs deletes the directories of local clusters whose owning
// process is gone (killed before it could clean up), stopping any server
// still running in them.
func removeStaleDirs() {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), dirPrefix+"*"))
	for _, dir := range dirs {
		owner, err := os.ReadFile(filepath.Join(dir, "owner.pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(owner)))
		if err != nil || processAlive(pid) {
			continue
		}
		if pm, err := os.ReadFile(filepath.Join(dir, "data", "postmaster.pid")); err == nil {
			line, _, _ := strings.Cut(string(pm), "\n")
			if pmPid, err := strconv.Atoi(strings.TrimSpace(line)); err == nil && processAlive(pmPid) {
				syscall.Kill(pmPid, syscall.SIGQUIT)
			}
		}
		os.RemoveAll(dir)
	}
}

func processAlive(pid int) bool {
	return pid > 0 && syscall.Kill(pid, 0) == nil
}

func tail(path string, lines int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	all := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(all) > lines {
		all = all[len(all)-lines:]
	}
	return strings.Join(all, "\n")
}
