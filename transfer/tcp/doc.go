// Package tcp is the pure-Go data plane: a transfer.Transport over plain TCP
// with a small framed binary protocol, the default backend.
//
// Block bytes are never copied on the hot path. The server writes a block's
// header and the bytes Handler.Open returned in one writev (net.Buffers) and
// releases the block right after; the client reads a block's bytes with one
// io.ReadFull straight into the buffer its Receiver returned and checks them
// against the header's xxhash64 before reporting them good. Puts run the
// other way round, into the buffer Handler.Reserve returned. Small frames
// (hellos, request headers, block headers, results) are read into small
// buffers, and a read of one asks only for the frames known to follow it
// at once (a response's first block header, a put's results, the 16
// bytes after a request's header), so that a Get of one block costs each
// side one read fewer and no read ever takes in payload bytes, which go
// straight to their buffer.
//
// # Concurrency
//
// A Listener serves each connection on its own goroutine, up to
// Options.MaxConns at once, and calls the Handler from all of them
// concurrently. A Conn carries one request at a time: concurrent calls on
// one Conn are serialised; pool Conns for parallelism. Close may be called
// at any time, from any goroutine, and fails the request in flight.
//
// # Protocol (version 1)
//
// All integers are little-endian. A connection opens with a hello each way:
//
//	client hello  "KVST" version:u8 0:u8 toklen:u16 token[toklen]
//	server hello  "KVST" version:u8 status:u8 msglen:u16 msg[msglen]
//
// The client's token (at most 512 bytes, none when toklen is 0) is its
// credential: a server whose Handler authenticates (transfer.Authenticator)
// checks it, with the TLS client certificate if there is one, once for the
// whole connection. A server hello with a status other than OK says why in
// msg: Refused for a client of another protocol version, Unavailable for a
// listener at its connection limit (try again later), Unauthenticated for
// a client whose credential is missing or not valid (msg: "authenticate
// first", nothing more); the server then closes the connection. After the hellos the client sends requests and the server
// answers each in turn, one at a time:
//
//	request   op:u8 0:u8 0:u16 count:u32                              (8 bytes)
//	response  status:u8 flags:u8 msglen:u16 count:u32 msg[msglen]
//
// op is 1 for Get and 2 for Put; count is the number of blocks. A Get request
// goes on with count keys, a Put request with count block headers and then
// the count payloads back to back, in header order:
//
//	key           ns:u64 hash:u64                                     (16 bytes)
//	block header  ns:u64 hash:u64 parent:u64 sum:u64 size:u32
//	              flags:u8 status:u8 msglen:u16                       (40 bytes)
//
// flags bit 0 is HasParent; no other bit is defined. In a Put the status and
// msglen of every block header are zero.
//
// A response with status OK has count equal to the request's count and goes
// on, for a Get, with one block header per key in request order, each
// followed by its msg and, when its status is OK, by its size bytes of
// payload; for a Put, with one result per block:
//
//	result  status:u8 0:u8 msglen:u16 msg[msglen]                     (4 bytes + msg)
//
// A response with status Refused answers a request the server refused as a
// whole, before applying any of it (a count or a block size over the limits,
// a malformed block header); msg says why and count is zero. The server reads
// and discards the rest of a refused request so that the connection stays
// usable, unless the request declares more bytes than a valid request could
// hold: then it sets flag bit 0 (closing) and closes the connection. A
// response with status Error answers a request the server could not parse (an
// unknown op); the server closes the connection after it.
//
// Status codes, for responses, blocks and results:
//
//	0 OK        1 NotFound    2 Corrupt (checksum mismatch)
//	3 Refused (for a block: the handler refused it)
//	4 Error (msg holds the server's error)
//	5 Full (the server had no room for the block; msg says why)
//	6 Unavailable (the server cannot serve it now, and may soon; msg says
//	  why: for a block, the server holds it but cannot read it now, as
//	  from an object store that is down; in a hello, the listener serves
//	  its limit of connections)
//	7 Unauthenticated (in a server hello only: see above)
//
// Every msg is UTF-8 text of at most 512 bytes, for a person to read.
//
// The server reads a whole request (keys, or block headers) before it writes
// a byte of the response, and writes a Put's results only after it read all
// payloads, so neither side ever blocks writing while the other is writing
// too. Every count and size from the network is checked against the limits
// before anything is allocated for it.
//
// A Get of two keys, the second missing, goes over the wire as
//
//	→ 01 000000 02000000                      get, 2 keys
//	  <ns> <hash>  <ns> <hash>                 the keys
//	← 00 00 0000 02000000                      OK, 2 blocks
//	  <key> <parent> <sum> 00001000 01 00 0000 block 0: 1 MiB, has a parent, OK
//	  <1 MiB of bytes>
//	  <key> 0 0 00000000 00 01 0000            block 1: NotFound, no bytes
//
// and a Put of two blocks, the second of 2 MiB to a node whose limit is 1 MiB, as
//
//	→ 02 000000 02000000  <header 0> <header 1>  <bytes 0> <bytes 1>
//	← 03 00 2a00 00000000 "block 1 is 2.0 MiB, over the 1.0 MiB limit"
//
// after which the server reads and drops both payloads and waits for the
// next request.
//
// # Deadlines
//
// A client sets its ctx's deadline on the socket for the whole request and,
// when ctx is cancelled, a deadline in the past, which fails the blocked
// read or write at once; a request that fails half way leaves the stream
// out of step, so the Conn closes and later calls return ErrClosed. A server
// waits Options.IdleTimeout for the next request and for each write of a
// response. A request must arrive within Options.RequestTimeout plus a
// second for every Options.MinRate bytes of it received, however often its
// bytes trickle in, so a peer that stalls mid-request costs the server a
// goroutine for a bounded time. TCP keep-alives (Options.KeepAlive) find
// peers whose machine went away.
//
// # Room for puts
//
// A server asks its Handler for room for a block only once the block's
// first 64 KiB (or all of it, if less) have arrived, and all connections
// together hold at most Options.MaxPendingBytes of room for blocks still
// arriving. A put that needs room beyond it cuts the connection whose
// request has been arriving slowest, under MinRate, for over a second, or
// waits for room until its RequestTimeout and then gets StatusFull: peers
// that stall cannot hold the Handler's memory from peers that send.
package tcp
