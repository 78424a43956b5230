# CTest labels of mm_tests, by kind, so a subset answers quickly:
#   unit         in-process and fast (about a minute for all of them with -j2): ctest -L unit
#   dist         several processes over loopback (mm launch, DDP, FSDP, distributed checkpoints)
#   e2e          training runs and the mm binary's commands end to end
#   conformance  against references from PyPI, npm and Debian (transformers, diffusers, tokenizers, Pillow,
#                ffmpeg, spm_encode) on fetched third-party material
# Included by CTest after gtest_discover_tests' list of mm_tests (mm_tests_TESTS). A test not
# named here is `unit`: give a new slow test its label here.
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...) in a CTest script
set(_mm_dist_suites ContextParallelTrain Distributed DistWorker DistributedCheckpoint DistributedTrain Fsdp Launch DeviceMesh TensorParallel
    TensorParallelTrain PipelineTrain LoraTrain)
set(_mm_dist_tests FlowMatchingTrain.FsdpDdpAndRecomputeEqualOneProcess
    FlowMatchingTrain.TensorAndPipelineParallelEqualOneProcess ContextParallel.AttentionEqualsOneProcess
    ContextParallel.VisionTowerEqualsOneProcess
    FlowMatchingTrain.ContextParallelEqualsOneProcess)
set(_mm_e2e_suites TrainE2E MllmE2E QuickstartVL Cli CliContract TokenizeCli FashionMnist Eval ExtractFeatures MovingFashionMnist
    WanVAETrain LatentStats Judge QuickstartVideo Convert Profile Report Memory ChunkedLoss)
set(_mm_e2e_tests Flops.FullSizeExamplesPrintTheOfficialParameterCounts ModelCore.ObjectiveAndDatasetAreRegistrations
    FlowMatchingTrain.TinyWanDiTLearnsAndResumesBitwise)
set(_mm_conformance_suites Qwen2Conformance VLConformance TokenizerConformance TokenizerVariants PretrainedTokenizer
    SentencePiece WanDiT WanVAE WanPipeline InitCommand ConvertConformance LoraConformance TensorBoard)
set(_mm_conformance_tests_umt5 UMT5.HiddenStatesEqualTransformers)
set(_mm_conformance_tests_diffusers FlowSchedulers.MatchDiffusersStepByStep)
set(_mm_conformance_tests
    ChatTemplate.Qwen2VLMatchesOfficialTemplate ChatTemplate.Qwen2VLAgreesWithQwen3TemplateWhereComparable
    ChatTemplate.Llama3MatchesPackageTemplate ChatTemplate.MistralLlavaDefaultEncodeTheirText
    ChatTemplate.BadConversationsAndMissingTokensAreErrors ChatTemplate.LabelsKeepAssistantContentAndEndOfTurn
    Image.Qwen2VLPixelValuesMatchTransformersRecipe Image.DecodeAndBicubicResizeMatchPillow
    Image.CorruptFilesAreClearErrors
    Video.ProcessVideoMatchesTransformersVideoProcessor Video.ProbeRealClips Video.DecodeRealClipsMatchFfmpeg
    Video.EncodedClipsProbeDecodeAndMatchFfmpeg Video.ProcessVideoGivesQwen2VLGrid Video.BrokenFilesAreCleanErrors
    Llava.MatchesTransformers Qwen2VLVision.MatchesTransformers Qwen2_5VLVision.MatchesTransformers
    TokenizerConfig.RealModels TextData.RealFortunes ${_mm_conformance_tests_diffusers} ${_mm_conformance_tests_umt5})
foreach(_mm_test IN LISTS mm_tests_TESTS)
  string(REGEX REPLACE "\\..*" "" _mm_suite "${_mm_test}")
  if(_mm_suite IN_LIST _mm_dist_suites OR _mm_test IN_LIST _mm_dist_tests)
    set(_mm_label dist)
  elseif(_mm_suite IN_LIST _mm_e2e_suites OR _mm_test IN_LIST _mm_e2e_tests)
    set(_mm_label e2e)
  elseif(_mm_suite IN_LIST _mm_conformance_suites OR _mm_test IN_LIST _mm_conformance_tests)
    set(_mm_label conformance)
  else()
    set(_mm_label unit)
  endif()
  set_tests_properties("${_mm_test}" PROPERTIES LABELS "${_mm_label}")
endforeach()
