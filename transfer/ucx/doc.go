// Package ucx is the UCX data plane: a transfer.Transport over UCX's tagged
// messages (cgo, libucp), built only with the build tag ucx. UCX maps it to
// the best transport the machine has: shared memory on one host, TCP, RDMA
// where present (Options.TLS narrows the choice). Without the tag this file
// is all there is, and nothing of UCX is linked.
//
// # Connecting
//
// A Listener listens on a TCP address, the node's data-plane address. A
// client connects there, and the two trade hellos and UCX worker
// addresses; each side then connects a UCX endpoint to the other's worker,
// and every byte after that moves over UCX. The socket stays open, idle, as
// the connection's liveness signal: when either side closes or dies, the
// other hears of it at once, whatever the UCX transport. We do not use
// UCX's own sockaddr listener (ucp_listener_create): in UCX 1.13 its
// connection manager refuses to connect unless a TCP transport on the
// route's device is among UCX_TLS ("device lo is not enabled"), so it
// cannot run over shared memory alone; and UCX tells an endpoint connected
// by worker address nothing when its peer closes it, only, much later,
// that a keep-alive went unanswered. ucx_perftest bootstraps the same way.
//
// A listener has one UCP context and one worker for all its connections,
// each with its own endpoint. A client connection has a context and a
// worker of its own (a client pools connections, so a process holds a few):
// two workers then have exactly one pair of endpoints between them, which
// UCX 1.13 needs to pair endpoints connected by address right (it pairs
// them in creation order); a connection's failure is its own; and
// destroying its worker is a certain end to anything UCX still had in
// flight for it. A worker costs a few MiB (its shared-memory FIFO), and a
// connection a few milliseconds to open (BenchmarkDial).
//
// # Moving bytes: tagged messages, not RMA
//
// Block bytes travel as tagged messages straight between the memory the
// Handler and the Receiver give: the server sends from the pinned slice
// Handler.Open returned (a view into the DRAM arena), the client posts a
// receive straight into the buffer Receiver.Buffer returned; puts run the
// other way, into the buffer Handler.Reserve returned. Above UCX's
// rendezvous threshold (8 KiB on shared memory) the sender only announces
// a message, and its bytes move once the receiver has posted where they
// go: on RDMA as an RDMA read of the sender's memory into the receiver's
// buffer, on one host pipelined through the receiver's shared-memory FIFO,
// over TCP through the socket; never through a staging buffer of ours. We
// chose this over RMA (ucp_mem_map of the arena, rkeys, ucp_get_nbx by the
// client) because:
//
//   - the Handler hands out one block's bytes at a time: the transport
//     knows no arena to map once, and mapping every block is what the
//     rendezvous does anyway;
//   - with peer-failure handling on (which a server that must survive its
//     clients needs, see below) UCX 1.13 has no RMA lane on one host at all:
//     it leaves cma out, and posix cannot expose arbitrary memory;
//   - with RMA the server cannot tell when a client is done reading a
//     block: it needs a release message, and a client that dies keeps the
//     block pinned until a timeout; a rendezvous send completes when the
//     bytes are read, and its completion releases the block;
//   - a tagged receive is posted where the bytes go after the header said
//     how many there are, which the Receiver contract requires;
//   - on RDMA the rendezvous is an RDMA read of the sender's memory: the
//     RMA path, without rkey bookkeeping of our own.
//
// # Blocks in GPU memory
//
// A Handler that hands out blocks in GPU memory in place
// (transfer.SourceOpener: the HBM tier's DeviceView) gives a device
// address; a Receiver that wants a block in GPU memory
// (transfer.DeviceReceiver) gives one too. Where the UCX in use moves CUDA
// memory (built with cuda_copy / cuda_ipc; the context's memory types say
// so at start) the chunks are sent from and received into those addresses
// with the request's memory type set to CUDA, and the client cannot hash
// them: the DeviceTarget's Verify checks them, if the receiver gave one.
// Otherwise (Debian's UCX has no CUDA) the Handler stages each block by DMA
// into a pinned bounce buffer and the client receives into one of its own
// and copies it to the device (transfer.Staged). Describe says which. The
// path from and into device memory has not run on a GPU yet.
//
// # Protocol (version 1)
//
// Hellos, on the socket (little-endian):
//
//	client  "KVUX" version:u8 0:u8 0:u16 addrlen:u32 0:u32 addr
//	server  "KVUX" version:u8 status:u8 msglen:u16 id:u32 chunk:u32
//	        addrlen:u32 0:u32 msg addr
//
// The server's status is OK, Refused (another protocol version) or
// Unavailable (the listener at MaxConns; try again later), with msg saying why. id names
// the connection in every tag; chunk is the server's ChunkSize. Messages
// then carry 64-bit tags:
//
//	id:24 | kind:4 | seq:8 | index:20 | chunk:8
//
// seq numbers the connection's requests, index is a block's place in a
// request (for a request: its count-1), chunk a chunk's place in a block.
// The frames are those of the tcp backend: request (op, count, then 16-byte
// keys or 40-byte block headers), response (status, msglen, count, msg),
// block header (key, parent, sum, size, flags, status, msglen, msg),
// result (status, msglen, msg). A Get:
//
//	→ get     the request with its keys
//	← resp    OK and the count, or Refused with why (nothing follows)
//	← header  block i's header, for each i in order; and when it is OK
//	← block   its bytes, in chunks of ChunkSize
//
// The server opens and sends blocks as the client fetches them, at most
// SendWindow bytes ahead. A Put asks before it sends:
//
//	→ put     the request with its block headers
//	← resp    Refused with why; or OK, the count and one byte per block:
//	          1 if the server reserved room for it (its chunk receives are
//	          posted), 0 if not (its result says why)
//	→ payload the bytes of each accepted block, in chunks
//	← results status and msg per block: OK, Corrupt (checksum), Full, Error
//
// A request over MaxBlocks or MaxBlockSize is refused whole before anything
// of it is reserved, and the connection goes on. The server takes requests
// off UCX's unexpected queue by probing for the two request kinds of any
// connection, and receives each into a buffer of its size, so that no
// session keeps a receive posted while it is idle. Receivers check every
// block's bytes against its xxhash64, one chunk at a time while the next
// moves, and report a mismatch as ErrCorrupt.
//
// # Progress without a spinning core
//
// A listener's worker is progressed by one goroutine (progress.go); sessions,
// each on its own goroutine because Handler calls may block, hand it their
// operations. A client connection's goroutine drives its own worker while
// it waits (progress.go), so that a client moves, checks and hands over its
// bytes on one thread. Both poll UCX for at most BusyPoll after their last
// activity (yielding the processor to other goroutines as they do), then
// arm the worker (ucp_worker_arm) and sleep in poll(2) on its event fd
// (ucp_worker_get_efd) and on an eventfd that new work, a Close, the
// socket closing or the request's ctx ending signal. Idle workers sleep.
//
// Every wait ends: a client's at its ctx's deadline or cancellation, when
// the connection is closed, when UCX fails the endpoint, or 250 ms after
// the node closed the socket (the answer to a request in flight may still
// be arriving on UCX's own connections); a server's at IdleTimeout, or when
// the client goes away. A node that drains a connection flushes its
// endpoint (ucp_ep_flush_nbx) before it closes the socket, so that its
// last answer leaves UCX's buffers before the endpoint is force-closed.
//
// # Memory under the cgo pointer rules
//
// UCX keeps the address of a buffer from the call that posts an operation
// until the operation completes, longer than a cgo call: the cgo rules
// allow that only for memory pinned with runtime.Pinner, and only while it
// stays pinned. So every buffer handed to UCX (Receiver and Handler buffers,
// a put's Data, the transport's own frames) is pinned right before the
// posting call and unpinned when UCX reports the operation complete; for
// memory Go does not manage, like the mmap'd DRAM arena, pinning is a
// no-op. Nothing else of Go's reaches C: UCX's completion callbacks are C
// functions that record an operation's integer id, status and length in a
// C array, which Go reads after each progress call; no Go function is ever
// called from C, and no Go pointer is stored in C memory.
//
// No operation hands a buffer back to its owner (Receiver.Done, Handler
// release and commit, returning from Get or Put) before UCX has completed
// the operation that uses it. A request that fails half way cancels its
// receives, force-closes its endpoint (which completes its sends) and waits
// for UCX to complete everything before it returns. UCX 1.13 has one flaw
// there: when a receiver goes away while two or more rendezvous sends to it
// are moving on a shared-memory endpoint, force-closing the endpoint leaves
// the others pending for good. Clients therefore receive one chunk at a
// time; a client destroys its worker, which ends everything; a listener
// keeps such sends' blocks opened (and their buffers pinned) until UCX
// completes them, at the latest when the listener closes and destroys its
// worker.
//
// UCX's registration cache (used by RDMA transports) learns that memory
// was freed through hooks on libc's munmap and madvise, which the Go
// runtime bypasses: the transport turns it off (RCACHE_ENABLE=n), so that
// a registration never outlives the Go memory it covers.
//
// # UCX settings
//
// Options become ucp_config_modify calls on each context, on top of what
// UCX reads from its UCX_* environment variables; the transport sets no
// environment variable. Endpoints ask for peer-failure handling
// (UCP_ERR_HANDLING_MODE_PEER), which force-closing an endpoint with
// operations in flight needs; UCX 1.13 grants it to its shared-memory
// transports only with MM_ERROR_HANDLING=y, which the transport sets
// whenever they may be used, and then leaves cma out (single-copy reads
// between processes), moving bulk data through posix shared memory
// instead. Lanes (LaneReporter) says which transports a connection or
// listener uses.
//
// # Concurrency
//
// A Listener serves each connection on its own goroutine, up to MaxConns,
// and calls the Handler from all of them at once. A Conn carries one
// request at a time; pool Conns for parallelism. Close may be called at any
// time, from any goroutine: it fails the request in flight and returns once
// the connection's worker is freed.
package ucx
