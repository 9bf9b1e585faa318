/* What an MPI rank sends, counted where it leaves the process: loaded with LD_PRELOAD into the ranks only.

   Two counts, both read from Python through ctypes (hpctrain/runtime/counting/wire.py; hpctrain_bench/wire_counts.py
   builds this library):
   - every MPI call by name: a wrapper per function of the MPI library counts the call and forwards it to
     PMPI_<name> in the MPI library (the wrappers are generated from its mpi_proto.h and appended to this file; the library is linked
     against libmpi, the standard PMPI way);
   - every send and receive on a TCP socket (AF_INET/AF_INET6 stream): calls, bytes and messages, per
     connection. With MPIR_CVAR_NOLOCAL=1 all of MPICH's traffic goes through its netmod, whose libfabric tcp
     provider writes each message with one send call; a call that follows a short write on the same connection
     continues that message and is not counted as a new one. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define MAX_FDS 65536
#define MAX_CONNS 8192

enum { FD_UNKNOWN = 0, FD_TCP = 1, FD_OTHER = 2 };

typedef struct {
    uint64_t local_port, peer_port, send_calls, sent_messages, sent_bytes, recv_calls, received_bytes, closed;
} hpctrain_conn;

static unsigned char fd_kind[MAX_FDS];
static int fd_conn[MAX_FDS];          /* connection slot + 1; 0: none yet */
static unsigned char fd_partial[MAX_FDS];
static hpctrain_conn conns[MAX_CONNS];
static uint64_t n_conns;

/* ------------------------------------------------------------------ libc, found once */

typedef ssize_t (*send_fn)(int, const void *, size_t, int);
typedef ssize_t (*sendto_fn)(int, const void *, size_t, int, const struct sockaddr *, socklen_t);
typedef ssize_t (*sendmsg_fn)(int, const struct msghdr *, int);
typedef ssize_t (*write_fn)(int, const void *, size_t);
typedef ssize_t (*writev_fn)(int, const struct iovec *, int);
typedef ssize_t (*recv_fn)(int, void *, size_t, int);
typedef ssize_t (*recvfrom_fn)(int, void *, size_t, int, struct sockaddr *, socklen_t *);
typedef ssize_t (*recvmsg_fn)(int, struct msghdr *, int);
typedef ssize_t (*read_fn)(int, void *, size_t);
typedef ssize_t (*readv_fn)(int, const struct iovec *, int);
typedef int (*close_fn)(int);
typedef int (*socket_fn)(int, int, int);
typedef int (*accept_fn)(int, struct sockaddr *, socklen_t *);
typedef int (*accept4_fn)(int, struct sockaddr *, socklen_t *, int);

static send_fn real_send;
static sendto_fn real_sendto;
static sendmsg_fn real_sendmsg;
static write_fn real_write;
static writev_fn real_writev;
static recv_fn real_recv;
static recvfrom_fn real_recvfrom;
static recvmsg_fn real_recvmsg;
static read_fn real_read;
static readv_fn real_readv;
static close_fn real_close;
static socket_fn real_socket;
static accept_fn real_accept;
static accept4_fn real_accept4;

static void *libc_symbol(const char *name) {
    void *p = dlsym(RTLD_NEXT, name);
    if (p == NULL) {
        fprintf(stderr, "hpctrain wire counts: %s not found in libc\n", name);
        abort();
    }
    return p;
}

/* Found at the first call, not in a constructor: the MPI library this one links runs its own constructors (and
   closes and writes descriptors) before this library's would run. */
#define REAL(name, type) (real_##name != NULL ? real_##name : (real_##name = (type)libc_symbol(#name)))

/* ------------------------------------------------------------------ sockets */

static uint64_t port_of(const struct sockaddr_storage *a) {
    if (a->ss_family == AF_INET) return ntohs(((const struct sockaddr_in *)a)->sin_port);
    if (a->ss_family == AF_INET6) return ntohs(((const struct sockaddr_in6 *)a)->sin6_port);
    return 0;
}

/* The connection slot of a TCP socket, NULL for any other descriptor (classified once per descriptor). */
static hpctrain_conn *conn_of(int fd) {
    if (fd < 0 || fd >= MAX_FDS) return NULL;
    unsigned char kind = __atomic_load_n(&fd_kind[fd], __ATOMIC_ACQUIRE);
    if (kind == FD_OTHER) return NULL;
    if (kind == FD_UNKNOWN) {
        int domain = 0, type = 0;
        socklen_t len = sizeof domain;
        int is_tcp = getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) == 0 &&
                     (domain == AF_INET || domain == AF_INET6);
        len = sizeof type;
        is_tcp = is_tcp && getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_STREAM;
        if (!is_tcp) {
            __atomic_store_n(&fd_kind[fd], FD_OTHER, __ATOMIC_RELEASE);
            return NULL;
        }
        struct sockaddr_storage local, peer;
        socklen_t ll = sizeof local, pl = sizeof peer;
        if (getsockname(fd, (struct sockaddr *)&local, &ll) != 0 || getpeername(fd, (struct sockaddr *)&peer, &pl) != 0)
            return NULL; /* not connected yet: ask again at the next call */
        uint64_t slot = __atomic_fetch_add(&n_conns, 1, __ATOMIC_ACQ_REL);
        if (slot >= MAX_CONNS) {
            __atomic_store_n(&fd_kind[fd], FD_OTHER, __ATOMIC_RELEASE);
            return NULL;
        }
        conns[slot].local_port = port_of(&local);
        conns[slot].peer_port = port_of(&peer);
        __atomic_store_n(&fd_conn[fd], (int)slot + 1, __ATOMIC_RELEASE);
        __atomic_store_n(&fd_kind[fd], FD_TCP, __ATOMIC_RELEASE);
    }
    int slot = __atomic_load_n(&fd_conn[fd], __ATOMIC_ACQUIRE);
    return slot > 0 ? &conns[slot - 1] : NULL;
}

static void count_send(int fd, ssize_t done, size_t wanted) {
    hpctrain_conn *c = conn_of(fd);
    if (c == NULL) return;
    __atomic_fetch_add(&c->send_calls, 1, __ATOMIC_RELAXED);
    if (done <= 0) return;
    if (!fd_partial[fd]) __atomic_fetch_add(&c->sent_messages, 1, __ATOMIC_RELAXED);
    fd_partial[fd] = (size_t)done < wanted;
    __atomic_fetch_add(&c->sent_bytes, (uint64_t)done, __ATOMIC_RELAXED);
}

static void count_recv(int fd, ssize_t done) {
    hpctrain_conn *c = conn_of(fd);
    if (c == NULL) return;
    __atomic_fetch_add(&c->recv_calls, 1, __ATOMIC_RELAXED);
    if (done > 0) __atomic_fetch_add(&c->received_bytes, (uint64_t)done, __ATOMIC_RELAXED);
}

static size_t iov_bytes(const struct iovec *iov, int n) {
    size_t total = 0;
    for (int i = 0; i < n; i++) total += iov[i].iov_len;
    return total;
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    ssize_t r = REAL(send, send_fn)(fd, buf, len, flags);
    count_send(fd, r, len);
    return r;
}

ssize_t sendto(int fd, const void *buf, size_t len, int flags, const struct sockaddr *to, socklen_t tolen) {
    ssize_t r = REAL(sendto, sendto_fn)(fd, buf, len, flags, to, tolen);
    count_send(fd, r, len);
    return r;
}

ssize_t sendmsg(int fd, const struct msghdr *msg, int flags) {
    ssize_t r = REAL(sendmsg, sendmsg_fn)(fd, msg, flags);
    count_send(fd, r, iov_bytes(msg->msg_iov, (int)msg->msg_iovlen));
    return r;
}

ssize_t write(int fd, const void *buf, size_t len) {
    ssize_t r = REAL(write, write_fn)(fd, buf, len);
    count_send(fd, r, len);
    return r;
}

ssize_t writev(int fd, const struct iovec *iov, int n) {
    ssize_t r = REAL(writev, writev_fn)(fd, iov, n);
    count_send(fd, r, iov_bytes(iov, n));
    return r;
}

ssize_t recv(int fd, void *buf, size_t len, int flags) {
    ssize_t r = REAL(recv, recv_fn)(fd, buf, len, flags);
    if (!(flags & MSG_PEEK)) count_recv(fd, r);
    return r;
}

ssize_t recvfrom(int fd, void *buf, size_t len, int flags, struct sockaddr *from, socklen_t *fromlen) {
    ssize_t r = REAL(recvfrom, recvfrom_fn)(fd, buf, len, flags, from, fromlen);
    if (!(flags & MSG_PEEK)) count_recv(fd, r);
    return r;
}

ssize_t recvmsg(int fd, struct msghdr *msg, int flags) {
    ssize_t r = REAL(recvmsg, recvmsg_fn)(fd, msg, flags);
    if (!(flags & MSG_PEEK)) count_recv(fd, r);
    return r;
}

ssize_t read(int fd, void *buf, size_t len) {
    ssize_t r = REAL(read, read_fn)(fd, buf, len);
    count_recv(fd, r);
    return r;
}

ssize_t readv(int fd, const struct iovec *iov, int n) {
    ssize_t r = REAL(readv, readv_fn)(fd, iov, n);
    count_recv(fd, r);
    return r;
}

/* A descriptor number closed or handed out anew is classified again at its next use. */
static void forget(int fd) {
    if (fd < 0 || fd >= MAX_FDS) return;
    int slot = __atomic_exchange_n(&fd_conn[fd], 0, __ATOMIC_ACQ_REL);
    if (slot > 0) conns[slot - 1].closed = 1;
    fd_partial[fd] = 0;
    __atomic_store_n(&fd_kind[fd], FD_UNKNOWN, __ATOMIC_RELEASE);
}

int close(int fd) {
    forget(fd);
    return REAL(close, close_fn)(fd);
}

int socket(int domain, int type, int protocol) {
    int fd = REAL(socket, socket_fn)(domain, type, protocol);
    forget(fd);
    return fd;
}

int accept(int fd, struct sockaddr *addr, socklen_t *len) {
    int r = REAL(accept, accept_fn)(fd, addr, len);
    forget(r);
    return r;
}

int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags) {
    int r = REAL(accept4, accept4_fn)(fd, addr, len, flags);
    forget(r);
    return r;
}

/* ------------------------------------------------------------------ read from Python */

int hpctrain_wire_version(void) { return 1; }

uint64_t hpctrain_wire_connections(hpctrain_conn *out, uint64_t max) {
    uint64_t n = __atomic_load_n(&n_conns, __ATOMIC_ACQUIRE);
    if (n > MAX_CONNS) n = MAX_CONNS;
    for (uint64_t i = 0; i < n && i < max; i++) {
        hpctrain_conn *c = &conns[i];
        out[i].local_port = c->local_port;
        out[i].peer_port = c->peer_port;
        out[i].send_calls = __atomic_load_n(&c->send_calls, __ATOMIC_RELAXED);
        out[i].sent_messages = __atomic_load_n(&c->sent_messages, __ATOMIC_RELAXED);
        out[i].sent_bytes = __atomic_load_n(&c->sent_bytes, __ATOMIC_RELAXED);
        out[i].recv_calls = __atomic_load_n(&c->recv_calls, __ATOMIC_RELAXED);
        out[i].received_bytes = __atomic_load_n(&c->received_bytes, __ATOMIC_RELAXED);
        out[i].closed = c->closed;
    }
    return n;
}
