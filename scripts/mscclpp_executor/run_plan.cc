// One rank of an MSCCL++ execution plan run: read this rank's input, execute the plan once, write the output;
// then time more calls, and write the output of one last call to OUT.last.
// Ranks meet through MSCCL++'s TCP bootstrap; rank 0 hands its unique id to the others through a file.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <mscclpp/core.hpp>
#include <mscclpp/executor.hpp>
#include <mscclpp/gpu_utils.hpp>
#include <string>
#include <thread>
#include <vector>

static std::vector<char> readFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

static mscclpp::UniqueId shareId(int rank, const std::string& idPath) {
  mscclpp::UniqueId id;
  if (rank == 0) {
    id = mscclpp::TcpBootstrap::createUniqueId();
    std::ofstream out(idPath + ".tmp", std::ios::binary);
    out.write(reinterpret_cast<const char*>(id.data()), id.size());
    out.close();
    std::rename((idPath + ".tmp").c_str(), idPath.c_str());
    return id;
  }
  for (;;) {
    std::vector<char> bytes = readFile(idPath);
    if (bytes.size() == id.size()) {
      std::copy(bytes.begin(), bytes.end(), id.begin());
      return id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

int main(int argc, char* argv[]) {
  if (argc != 11) {
    std::cerr << "usage: run_plan PLAN RANK WORLD ID_FILE IN OUT RECV_BYTES SEND_OFFSET RECV_OFFSET ITERS\n"
                 "  (in place: one buffer, send and receive at those byte offsets; SEND_OFFSET -1: out of place)\n";
    return 2;
  }
  const std::string planPath = argv[1];
  const int rank = std::stoi(argv[2]), world = std::stoi(argv[3]);
  const std::string idPath = argv[4], inPath = argv[5], outPath = argv[6];
  const size_t recvBytes = std::stoull(argv[7]);
  const long long sendOffset = std::stoll(argv[8]), recvOffset = std::stoll(argv[9]);
  const int iters = std::stoi(argv[10]);
  int devices = 0;
  MSCCLPP_CUDATHROW(cudaGetDeviceCount(&devices));
  MSCCLPP_CUDATHROW(cudaSetDevice(rank % devices));  // one GPU: every rank shares it

  auto bootstrap = std::make_shared<mscclpp::TcpBootstrap>(rank, world);
  bootstrap->initialize(shareId(rank, idPath));
  auto communicator = std::make_shared<mscclpp::Communicator>(bootstrap);
  auto executor = std::make_shared<mscclpp::Executor>(communicator);
  mscclpp::ExecutionPlan plan(planPath, rank);

  std::vector<char> input = readFile(inPath);
  const bool inplace = sendOffset >= 0;
  const size_t span = std::max(sendOffset + input.size(), recvOffset + recvBytes);
  mscclpp::GpuBuffer<char> first(inplace ? span : input.size()), second(inplace ? 0 : recvBytes);
  char* send = inplace ? first.data() + sendOffset : first.data();
  char* recv = inplace ? first.data() + recvOffset : second.data();
  MSCCLPP_CUDATHROW(cudaMemcpy(send, input.data(), input.size(), cudaMemcpyHostToDevice));
  cudaStream_t stream;
  MSCCLPP_CUDATHROW(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  bootstrap->barrier();
  executor->execute(rank, send, recv, input.size(), recvBytes, mscclpp::DataType::FLOAT32, plan, stream);
  MSCCLPP_CUDATHROW(cudaStreamSynchronize(stream));
  std::vector<char> output(recvBytes);
  MSCCLPP_CUDATHROW(cudaMemcpy(output.data(), recv, recvBytes, cudaMemcpyDeviceToHost));
  std::ofstream(outPath, std::ios::binary).write(output.data(), output.size());

  // Later calls reuse the plan's connections: time them (a shared GPU time-slices the ranks' kernels).
  bootstrap->barrier();
  cudaEvent_t start, stop;
  MSCCLPP_CUDATHROW(cudaEventCreate(&start));
  MSCCLPP_CUDATHROW(cudaEventCreate(&stop));
  MSCCLPP_CUDATHROW(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; i++) {
    executor->execute(rank, send, recv, input.size(), recvBytes, mscclpp::DataType::FLOAT32, plan, stream);
  }
  MSCCLPP_CUDATHROW(cudaEventRecord(stop, stream));
  MSCCLPP_CUDATHROW(cudaEventSynchronize(stop));
  float ms = 0;
  MSCCLPP_CUDATHROW(cudaEventElapsedTime(&ms, start, stop));
  bootstrap->barrier();

  // One more call on a cleared output and the input restored: the plan's scratch and (LL) packet flags are
  // now those of a later call, which must give the same bits.
  MSCCLPP_CUDATHROW(cudaMemset(recv, 0, recvBytes));
  MSCCLPP_CUDATHROW(cudaMemcpy(send, input.data(), input.size(), cudaMemcpyHostToDevice));
  bootstrap->barrier();
  executor->execute(rank, send, recv, input.size(), recvBytes, mscclpp::DataType::FLOAT32, plan, stream);
  MSCCLPP_CUDATHROW(cudaStreamSynchronize(stream));
  MSCCLPP_CUDATHROW(cudaMemcpy(output.data(), recv, recvBytes, cudaMemcpyDeviceToHost));
  std::ofstream(outPath + ".last", std::ios::binary).write(output.data(), output.size());
  bootstrap->barrier();
  std::printf("rank %d: ok, %d more calls, %.1f us each\n", rank, iters, iters ? ms * 1000.0 / iters : 0.0);
  return 0;
}
